"""The Responses API on the agent gateway: each request answered as the chat-completions call it stands for.

Why through the chat path rather than beside it: the gateway's whole value is that every call becomes
training tokens exactly as generated, and a call that continues an earlier one extends that call's sample
(:mod:`.calls`). That logic keys on chat messages. A Responses request is turned into the same messages
(``instructions`` -> system, input items -> user / assistant-with-tool-calls / tool messages), answered by
:meth:`~agentevolver.gateway.episodes.Gateway.chat` with its limits and refusals, and the reply turned back
into Responses output items. An agent that echoes the output items back (or names them with
``previous_response_id``) sends messages equal to what the episode saw, so its calls chain token for token
like a chat agent's.

Stored responses (``store``, the default) live with their episode and go when it closes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from agentevolver.gateway.episodes import Gateway
from agentevolver.llm_server.errors import ServerError, validation_error_to_server_error
from agentevolver.llm_server.replies import dump
from agentevolver.schema.gateway_wire import GatewayChatRequest
from agentevolver.schema.responses_wire import ResponsesRequest

__all__ = ["answer_response", "chat_messages", "response_events"]

_EVENT = TypeAdapter(ResponseStreamEvent)
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


async def answer_response(gateway: Gateway, episode_id: str, body: ResponsesRequest) -> Response:
    """Answer one Responses call of an episode (module docstring); stores it when ``body.store``."""
    episode = gateway.get(episode_id)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = episode.stored_responses.get(body.previous_response_id)
        if stored is None:
            raise ServerError(404, f"no stored response {body.previous_response_id!r} in this episode (responses are "
                                   "kept while their episode runs, when sent with store: true)",
                              param="previous_response_id", code="previous_response_not_found")
        history = stored
    conversation = [*history, *chat_messages(body.input)]
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    completion, _ = await gateway.chat(episode_id, _chat_request(body, [*system, *conversation]))
    reply = dump(completion.choices[0].message)
    response = _response(completion, body)
    if body.store:
        episode.stored_responses[response.id] = [*conversation, _echoed(reply)]
    return response


def chat_messages(items: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input items as chat messages (a 400 names the item that has no chat form). Consecutive
    ``function_call`` items, and an assistant message right before them, are one assistant turn, as the
    model produced them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": _text_field(item, "call_id", where), "type": "function",
                    "function": {"name": _text_field(item, "name", where),
                                 "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _text_field(item, "call_id", where),
                             "content": _output_text(item.get("output"), where)})
        else:
            raise ServerError(400, f"{where}: items of type {kind!r} are not served by the training gateway (it "
                                   "takes messages, function_call and function_call_output items)",
                              param=f"{where}.type")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = _ROLES.get(str(item.get("role")))
    if role is None:
        raise ServerError(400, f"{where}.role must be user, system, developer or assistant; got {item.get('role')!r}",
                          param=f"{where}.role")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for part_index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ServerError(400, f"{where}.content[{part_index}]: parts of type {kind!r} are not served by the "
                                       "training gateway (text only)", param=f"{where}.content[{part_index}].type")
            texts.append(str(part.get("text") or ""))
        content = "".join(texts)
    elif not isinstance(content, str):
        raise ServerError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
    return {"role": role, "content": content}


def _text_field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise ServerError(400, f"{where}.{name} must be a non-empty string", param=f"{where}.{name}")
    return value


def _output_text(output: Any, where: str) -> str:
    """A function_call_output's ``output``: a string, or a list of text parts."""
    if isinstance(output, str):
        return output
    if isinstance(output, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in output):
        return "".join(str(p.get("text") or "") for p in output)
    raise ServerError(400, f"{where}.output must be a string or a list of text parts", param=f"{where}.output")


def _echoed(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as the chat message an agent would echo back (what :func:`chat_messages` makes of the output)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    if reply.get("tool_calls"):
        message["tool_calls"] = reply["tool_calls"]
    return message


def _chat_request(body: ResponsesRequest, messages: list[dict[str, Any]]) -> GatewayChatRequest:
    tools = None
    if body.tools:
        tools = [{"type": "function", "function": {"name": tool.name, "description": tool.description,
                                                   "parameters": tool.parameters or {"type": "object"}}}
                 for tool in body.tools]
    tool_choice: Any = body.tool_choice
    if isinstance(tool_choice, dict):
        tool_choice = {"type": "function", "function": {"name": tool_choice["name"]}}
    fields = {"model": body.model, "messages": messages, "tools": tools, "tool_choice": tool_choice,
              "max_completion_tokens": body.max_output_tokens}
    try:
        return GatewayChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as err:
        raise validation_error_to_server_error(list(err.errors()), GatewayChatRequest) from err


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _response(completion: ChatCompletion, body: ResponsesRequest) -> Response:
    """The chat reply as a Responses ``Response``: a message item for its text, a ``function_call`` item per
    tool call; ``incomplete`` (``max_output_tokens``) when the generation hit its limit."""
    choice = completion.choices[0]
    message = choice.message
    output: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        output.append({"type": "message", "id": _new_id("msg"), "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": message.content or "", "annotations": [],
                                    "logprobs": []}]})
    for call in message.tool_calls or ():
        output.append({"type": "function_call", "id": _new_id("fc"), "call_id": call.id, "status": "completed",
                       "name": call.function.name, "arguments": call.function.arguments})  # type: ignore[union-attr]
    usage = completion.usage
    prompt_tokens = usage.prompt_tokens if usage else 0
    completion_tokens = usage.completion_tokens if usage else 0
    incomplete = choice.finish_reason == "length"
    tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
              "strict": t.strict} for t in body.tools or ()]
    return Response.model_validate({
        "id": _new_id("resp"), "object": "response", "created_at": float(completion.created),
        "completed_at": time.time(), "model": body.model, "output": output,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None, "error": None,
        "instructions": body.instructions, "previous_response_id": body.previous_response_id,
        "parallel_tool_calls": True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        "tool_choice": body.tool_choice or "auto", "tools": tools, "temperature": body.temperature,
        "top_p": body.top_p, "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
        "text": {"format": {"type": "text"}}, "truncation": body.truncation or "disabled",
        "usage": {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                  "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": prompt_tokens + completion_tokens},
    })


async def response_events(response: Response) -> AsyncIterator[str]:
    """Server-sent events for a finished response, in the order OpenAI sends them: created, in progress, per
    output item its added / delta / done events, then completed (or incomplete). The generator reports no
    tokens before a reply ends, so each text arrives in one delta."""
    sequence = 0

    def event(kind: str, **fields: Any) -> str:
        nonlocal sequence
        payload = dump(_EVENT.validate_python({"type": kind, "sequence_number": sequence, **fields}))
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    final = dump(response)
    started = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(final["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "content": []})
            part = item["content"][0]
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            yield event("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **at, content_index=0, part=part)
        else:
            yield event("response.output_item.added", output_index=index,
                        item={**item, "status": "in_progress", "arguments": ""})
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
