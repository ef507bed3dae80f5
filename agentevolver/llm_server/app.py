"""The FastAPI app: OpenAI-compatible routes over one :class:`~agentevolver.llm_server.engine.Engine`.

Routes: ``GET /healthz`` (``OK`` once the model is loaded; the app is only served after loading), ``GET
/v1/models``, ``POST /v1/chat/completions`` (with ``response_format`` ``json_object`` / ``json_schema``
enforced by a grammar: :mod:`.structured`), ``POST /v1/completions`` and ``GET /stats`` (the generator's
batch counters, so a caller can see that concurrent requests were decoded together). Every error is
OpenAI's ``{"error": {message, type, param, code}}`` with ``param`` naming the request field to change.

Concurrency: each request awaits the engine, and the generator batches every request pending at that
moment into one decode (see docs/cpu_generator.md), which is what sets this server apart from a server
that runs one ``generate`` at a time. A client that disconnects has its rows dropped from the running
batch at the next step, so retries after a client-side timeout do not pile up work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from openai.types import Completion, CompletionChoice, CompletionUsage, Model
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionTokenLogprob,
)
from openai.types.chat.chat_completion import Choice as ChatChoice
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall
from openai.types.completion_choice import Logprobs as CompletionLogprobs
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver import __version__
from agentevolver.llm_server.engine import Choice, Engine, SamplingRequest, TokenLogprob
from agentevolver.llm_server.errors import ServerError, validation_error_to_server_error
from agentevolver.schema.llm_wire import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    ModelList,
    ServerStats,
)

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

#: Request model per route, for "did you mean" hints on unknown fields.
_REQUEST_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}

def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorBody} for status in statuses}


#: Declared errors (OpenAI's shape): 400 a field, 401 the key, 404 the model name, 499 the client left,
#: 500 generation failed, 503 shutting down.
_ERRORS = _errors(400, 401, 404, 499, 500, 503)
#: Starlette's own errors (a body that is not UTF-8, an unknown route, a wrong method), in OpenAI's shape.
_HTTP_PARAMS = {400: "body", 404: "path", 405: "method"}

#: How often a request waiting for its batch checks whether its client is still connected (seconds).
DISCONNECT_POLL_S = 0.5


def create_app(
    engine: Engine, *, api_key_env: str | None = None, tool_call_parser: str | None = "hermes"
) -> FastAPI:
    """Build the app around a loaded ``engine``; the engine is closed when the app shuts down.

    Args:
        api_key_env: NAME of an environment variable holding the key clients must send as
            ``Authorization: Bearer <key>`` (every route but ``/healthz``); ``None`` = no key.
        tool_call_parser: registry name of the parser (agentevolver.module.tools.parsing) that turns tool
            calls in a reply into ``message.tool_calls`` when a request carries ``tools``; ``None`` = never.
    """
    api_key = _api_key(api_key_env)
    parser = _tool_parser(tool_call_parser)
    counters = {"chat_requests": 0, "completion_requests": 0, "rejected": 0, "disconnected": 0, "in_flight": 0}
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        logger.info("serving %r (max_model_len %d)", engine.served_name, engine.max_model_len)
        try:
            yield
        finally:
            await engine.aclose()

    app = FastAPI(title="AgentEvolver local LLM server", version=__version__, lifespan=lifespan)
    app.state.engine = engine

    async def require_key(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))],
    ) -> None:
        if api_key is None:
            return
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), api_key.encode()):
            raise ServerError(
                401, f"missing or wrong API key: send 'Authorization: Bearer <key>' with the key held in the "
                     f"server's {api_key_env} environment variable",
                param="Authorization", type_="authentication_error", code="invalid_api_key",
            )

    guarded = [Depends(require_key)]

    @app.exception_handler(ServerError)
    async def on_server_error(_: Request, err: ServerError) -> JSONResponse:
        counters["rejected"] += 400 <= err.status < 499
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = ("the body is not valid JSON: send a UTF-8 JSON object" if err.status_code == 400
                   else f"{request.method} {request.url.path}: {err.detail} (see /docs for the routes)")
        return await on_server_error(request, ServerError(err.status_code, message,
                                                          param=_HTTP_PARAMS.get(err.status_code)))

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        model = _REQUEST_MODELS.get(request.url.path)
        return await on_server_error(request, validation_error_to_server_error(list(err.errors()), model))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
        """A failed batch (``GenerationError``) or a bug: 500 in OpenAI's shape, which clients retry."""
        from agentevolver.backends.cpu import GeneratorClosedError

        if isinstance(err, GeneratorClosedError):
            return await on_server_error(request, ServerError(503, "the server is shutting down",
                                                              type_="server_error"))
        logger.exception("request to %s failed", request.url.path)
        return await on_server_error(request, ServerError(500, f"generation failed: {type(err).__name__}: {err}",
                                                          type_="server_error"))

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "OK"

    @app.get("/stats", dependencies=guarded, response_model=None,
             responses={200: {"model": ServerStats}, **_errors(401)})
    async def stats() -> dict[str, Any]:
        """Generator counters (``batches``, ``rows``, ``max_rows``, tokens, ...), request counters and the
        structured-output counters (grammars compiled, cache hits, constrained choices, refused formats)."""
        return {"model": engine.served_name, "generator": engine.stats, "server": dict(counters),
                "structured": dict(engine.structured.stats)}

    @app.get("/v1/models", dependencies=guarded, response_model=None,
             responses={200: {"model": ModelList}, **_errors(401)})
    async def models() -> dict[str, Any]:
        card = Model(id=engine.served_name, created=created, object="model", owned_by="agentevolver")
        return {"object": "list", "data": [{**_dump(card), "max_model_len": engine.max_model_len}]}

    @app.post("/v1/chat/completions", dependencies=guarded, response_model=ChatCompletion, responses={
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
              "description": "The completion (JSON), or server-sent events with 'stream: true'."},
        **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI chat completions; ``stream: true`` answers server-sent events (see :func:`_chunks`)."""
        counters["chat_requests"] += 1
        _check_model(engine, body.model)
        messages = [message.for_template() for message in body.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in body.tools] if body.tools else None
        prompt = engine.render_chat(messages, tools, body.chat_template_kwargs)
        budget = engine.check_prompt(prompt, max_tokens=body.completion_limit, prompt_field="messages",
                                     limit_field=body.limit_field)
        grammar = await engine.grammar_for(body.response_format)
        choices = await _run(request, counters, engine.complete(prompt, _sampling(body, body.logprobs),
                                                                   max_tokens=budget, grammar=grammar))
        usage = _usage(len(prompt), choices)
        response = _chat_response(engine.served_name, choices, usage, parser if body.parse_tools else None, tools)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_chunks(response, include_usage), media_type="text/event-stream")
        return JSONResponse(_dump(response))

    @app.post("/v1/completions", dependencies=guarded, response_model=Completion, responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """OpenAI (legacy) text completions over raw prompts: no chat template."""
        counters["completion_requests"] += 1
        _check_model(engine, body.model)
        max_tokens = 16 if body.max_tokens is None else body.max_tokens  # OpenAI's and vLLM's default here
        prompts = []
        for index, prompt in enumerate(body.prompts()):
            ids = engine.encode_text(prompt) if isinstance(prompt, str) else prompt
            field = "prompt" if len(body.prompts()) == 1 else f"prompt.{index}"
            prompts.append((ids, engine.check_prompt(ids, max_tokens=max_tokens, prompt_field=field,
                                                     limit_field="max_tokens")))
        sampling = _sampling(body, body.logprobs is not None)
        results = await _run(request, counters, asyncio.gather(
            *(engine.complete(ids, sampling, max_tokens=budget) for ids, budget in prompts)
        ))
        choices = [
            CompletionChoice(index=index, text=choice.text, finish_reason=choice.finish_reason,  # type: ignore[arg-type]
                             logprobs=_completion_logprobs(choice.logprobs))
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
        return JSONResponse(_dump(response))

    return app


# -- request helpers ------------------------------------------------------------------------------------------


def _api_key(api_key_env: str | None) -> str | None:
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(f"--api-key-env names {api_key_env!r} but that environment variable is unset or empty; "
                         "export the key in it or leave --api-key-env out")
    return key


def _tool_parser(name: str | None) -> Any:
    if name is None:
        return None
    from agentevolver.module.tools.parsing import get_parser

    return get_parser(name)


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


# -- responses -----------------------------------------------------------------------------------------------


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True)


def _usage(prompt_tokens: int, choices: list[Choice]) -> CompletionUsage:
    completion = sum(choice.completion_tokens for choice in choices)
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                           total_tokens=prompt_tokens + completion)


def _chat_response(
    served_name: str, choices: list[Choice], usage: CompletionUsage, parser: Any, tools: list[dict[str, Any]] | None
) -> ChatCompletion:
    out = []
    for index, choice in enumerate(choices):
        content: str | None = choice.text
        tool_calls = None
        finish = choice.finish_reason
        if parser is not None:
            action = parser.extract(choice.text, tools)
            if action.tool_calls and not action.errors:  # a broken block: the raw text goes back, as in vLLM
                content = action.content or None
                tool_calls = [
                    ChatCompletionMessageFunctionToolCall(
                        id=call.id or f"call_{uuid.uuid4().hex[:24]}", type="function",
                        function={"name": call.function.name, "arguments": call.function.arguments},
                    )
                    for call in action.tool_calls
                ]
                finish = "tool_calls"
        message = ChatCompletionMessage(role="assistant", content=content, refusal=None)
        if tool_calls:
            message.tool_calls = tool_calls  # type: ignore[assignment]
        logprobs = None
        if choice.logprobs is not None:
            logprobs = ChoiceLogprobs(content=[_chat_logprob(item) for item in choice.logprobs], refusal=None)
        out.append(ChatChoice(index=index, message=message, finish_reason=finish, logprobs=logprobs))  # type: ignore[arg-type]
    return ChatCompletion(
        id=f"chatcmpl-{uuid.uuid4().hex}", object="chat.completion", created=int(time.time()),
        model=served_name, choices=out, usage=usage,
    )


def _chat_logprob(item: TokenLogprob) -> ChatCompletionTokenLogprob:
    return ChatCompletionTokenLogprob(token=item.token, logprob=item.logprob,
                                      bytes=list(item.token.encode("utf-8")), top_logprobs=[])


def _completion_logprobs(items: list[TokenLogprob] | None) -> CompletionLogprobs | None:
    if items is None:
        return None
    offsets, position = [], 0
    for item in items:
        offsets.append(position)
        position += len(item.token)
    return CompletionLogprobs(tokens=[i.token for i in items], token_logprobs=[i.logprob for i in items],
                              text_offset=offsets, top_logprobs=None)


async def _chunks(response: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events for a finished reply: per choice a role chunk, its content, then its finish.

    The generator reports no tokens before a row ends, so the content arrives in one chunk; clients that
    only speak the streaming protocol still work, they just see no gradual output.
    """
    common = {"id": response.id, "object": "chat.completion.chunk", "created": response.created,
              "model": response.model}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = ChatCompletionChunk.model_validate({**common, "choices": choices, **extra})
        return f"data: {json.dumps(_dump(chunk))}\n\n"

    for choice in response.choices:
        message = choice.message
        yield event([{"index": choice.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        delta: dict[str, Any] = {}
        if message.content:
            delta["content"] = message.content
        if message.tool_calls:
            delta["tool_calls"] = [
                {"index": i, "id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}  # type: ignore[union-attr]
                for i, call in enumerate(message.tool_calls)
            ]
        if delta:
            logprobs = _dump(choice.logprobs) if choice.logprobs is not None else None
            yield event([{"index": choice.index, "delta": delta, "finish_reason": None, "logprobs": logprobs}])
        yield event([{"index": choice.index, "delta": {}, "finish_reason": choice.finish_reason}])
    if include_usage and response.usage is not None:
        yield event([], usage=_dump(response.usage))
    yield "data: [DONE]\n\n"

