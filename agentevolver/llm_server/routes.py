"""The OpenAI-compatible routes of the local LLM server, as one router over the app's state.

Each route reaches what the app was built with (the :class:`~agentevolver.llm_server.engine.Engine`, the
tool-call parser, the request counters) through a dependency that reads ``request.app.state.server``, so
the routes are plain module-level functions and :func:`agentevolver.llm_server.app.create_app` only builds
the app and includes this router. Every route here needs the API key when one is set; ``/healthz`` is on
the app. Requests are :mod:`agentevolver.schema.llm_wire` models; answers are built by :mod:`.replies`.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from openai.types import Completion, CompletionChoice, CompletionUsage, Model
from openai.types.chat import ChatCompletion

from agentevolver.llm_server.engine import Engine, SamplingRequest
from agentevolver.llm_server.errors import ServerError
from agentevolver.llm_server.forced_calls import TOOL_CHOICE_PARAM, call_schema
from agentevolver.llm_server.replies import chat_chunks, chat_response, completion_logprobs, dump, usage_of
from agentevolver.schema.llm_wire import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    ModelList,
    ServerStats,
)

__all__ = ["DISCONNECT_POLL_S", "ServerState", "errors", "router"]

#: How often a request waiting for its batch checks whether its client is still connected (seconds).
DISCONNECT_POLL_S = 0.5


@dataclass
class ServerState:
    """What the routes share: one per app, kept at ``app.state.server``."""

    engine: Engine
    parser: Any  # the tool-call parser (agentevolver.module.tools.parsing), or None = never parse
    api_key: str | None
    api_key_env: str | None
    created: int = field(default_factory=lambda: int(time.time()))
    counters: dict[str, int] = field(default_factory=lambda: {
        "chat_requests": 0, "completion_requests": 0, "rejected": 0, "disconnected": 0, "in_flight": 0})


def _state(request: Request) -> ServerState:
    return request.app.state.server


State = Annotated[ServerState, Depends(_state)]


async def require_key(
    state: State,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))],
) -> None:
    """``Authorization: Bearer <key>`` with the key of ``--api-key-env``, when the server was given one."""
    if state.api_key is None:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), state.api_key.encode()):
        raise ServerError(
            401, f"missing or wrong API key: send 'Authorization: Bearer <key>' with the key held in the "
                 f"server's {state.api_key_env} environment variable",
            param="Authorization", type_="authentication_error", code="invalid_api_key",
        )


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Declared error answers (OpenAI's shape) for the OpenAPI document."""
    return {status: {"model": ErrorBody} for status in statuses}


#: Declared errors (OpenAI's shape): 400 a field, 401 the key, 404 the model name, 499 the client left,
#: 500 generation failed, 503 shutting down.
_ERRORS = errors(400, 401, 404, 499, 500, 503)

router = APIRouter(dependencies=[Depends(require_key)])


@router.get("/stats", response_model=None, responses={200: {"model": ServerStats}, **errors(401)})
async def stats(state: State) -> dict[str, Any]:
    """Generator counters (``batches``, ``rows``, ``max_rows``, tokens, ...), request counters and the
    structured-output counters (grammars compiled, cache hits, constrained choices, refused formats)."""
    engine = state.engine
    return {"model": engine.served_name, "generator": engine.stats, "server": dict(state.counters),
            "structured": dict(engine.structured.stats)}


@router.get("/v1/models", response_model=None, responses={200: {"model": ModelList}, **errors(401)})
async def models(state: State) -> dict[str, Any]:
    engine = state.engine
    card = Model(id=engine.served_name, created=state.created, object="model", owned_by="agentevolver")
    return {"object": "list", "data": [{**dump(card), "max_model_len": engine.max_model_len}]}


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={
    # With 'stream: true' each server-sent event is {"event": ..., "data": <a chunk's JSON, or [DONE]>}.
    200: {"content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}}}},
          "description": "The completion (JSON), or server-sent events with 'stream: true'."},
    **_ERRORS})
async def chat_completions(body: ChatCompletionRequest, request: Request, state: State) -> Response:
    """OpenAI chat completions; ``stream: true`` answers server-sent events (see :func:`.replies.chat_chunks`)."""
    engine = state.engine
    state.counters["chat_requests"] += 1
    _check_model(engine, body.model)
    messages = [message.for_template() for message in body.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
    prompt = engine.render_chat(messages, tools, body.chat_template_kwargs)
    budget = engine.check_prompt(prompt, max_tokens=body.completion_limit, prompt_field="messages",
                                 limit_field=body.limit_field)
    if body.forced_tool_choice:  # the reply is a call: decoded under the tools' schemas (.forced_calls)
        grammar = await engine.structured.grammar_for_schema(call_schema(body), TOOL_CHOICE_PARAM)
    else:
        grammar = await engine.grammar_for(body.response_format)
    choices = await _run(request, state.counters, engine.complete(prompt, _sampling(body, body.logprobs),
                                                                 max_tokens=budget, grammar=grammar))
    response = chat_response(engine.served_name, choices, usage_of(len(prompt), choices),
                             state.parser if body.parse_tools else None, tools,
                             forced=body.tool_choice if body.forced_tool_choice else None)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(chat_chunks(response, include_usage), media_type="text/event-stream")
    return JSONResponse(dump(response))


@router.post("/v1/completions", response_model=Completion, responses=_ERRORS)
async def completions(body: CompletionRequest, request: Request, state: State) -> Response:
    """OpenAI (legacy) text completions over raw prompts: no chat template."""
    engine = state.engine
    state.counters["completion_requests"] += 1
    _check_model(engine, body.model)
    max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's and vLLM's default here
    prompts = []
    for index, prompt in enumerate(body.prompts()):
        ids = engine.encode_text(prompt) if isinstance(prompt, str) else prompt
        where = "prompt" if len(body.prompts()) == 1 else f"prompt.{index}"
        prompts.append((ids, engine.check_prompt(ids, max_tokens=max_tokens, prompt_field=where,
                                                 limit_field="max_tokens")))
    sampling = _sampling(body, body.logprobs is not None)
    results = await _run(request, state.counters, asyncio.gather(
        *(engine.complete(ids, sampling, max_tokens=budget) for ids, budget in prompts)
    ))
    choices = [
        CompletionChoice(index=index, text=choice.text, finish_reason=choice.finish_reason,  # type: ignore[arg-type]
                         logprobs=completion_logprobs(choice.logprobs))
        for index, choice in enumerate(c for per_prompt in results for c in per_prompt)
    ]
    prompt_tokens = sum(len(ids) for ids, _ in prompts)
    completion_tokens = sum(c.completion_tokens for per_prompt in results for c in per_prompt)
    response = Completion(
        id=f"cmpl-{uuid.uuid4().hex}", object="text_completion", created=int(time.time()),
        model=engine.served_name, choices=choices,
        usage=CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                              total_tokens=prompt_tokens + completion_tokens),
    )
    return JSONResponse(dump(response))


# -- request helpers ------------------------------------------------------------------------------------------


def _check_model(engine: Engine, model: str) -> None:
    if model != engine.served_name:
        raise ServerError(
            404, f"model {model!r} is not served here; this server serves {engine.served_name!r} "
                 "(see GET /v1/models): send that name in the 'model' field",
            param="model", code="model_not_found",
        )


def _sampling(body: ChatCompletionRequest | CompletionRequest, logprobs: bool) -> SamplingRequest:
    return SamplingRequest(
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        repetition_penalty=body.repetition_penalty, stop=body.stop_strings(),
        stop_token_ids=tuple(body.stop_token_ids or ()), ignore_eos=body.ignore_eos, seed=body.seed,
        logprobs=logprobs, n=body.n,
    )


async def _run(request: Request, counters: dict[str, int], work: Awaitable[Any]) -> Any:
    """Await ``work`` unless the client goes away first; then cancel it (its rows leave the batch)."""
    counters["in_flight"] += 1
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                counters["disconnected"] += 1
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ServerError(499, "the client disconnected before the reply was ready", type_="client_closed")
    finally:
        counters["in_flight"] -= 1
        if not task.done():
            task.cancel()
