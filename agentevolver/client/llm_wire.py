"""A chat completion on the wire: the request a call's arguments make and the result read from the reply.

Pure functions of an endpoint's config and the SDK's objects, so that the sync and the async path of
:class:`~agentevolver.client.llm_client.LLMClient` cannot build or read a request differently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentevolver.client.llm_config import LLMEndpointConfig
from agentevolver.client.retry import RetryableFailure
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["ChatResult", "Message", "Usage", "build_request", "read_reply", "short"]

_MAX_DETAIL_CHARS = 400

Message = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts the server reported (0 when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The first choice of a chat completion, plus what it cost.

    ``attempts`` is how many HTTP attempts the call took (1 = no retry): roles log it, and tests assert it.
    ``text`` is ``""`` when the server sent no content (e.g. only tool calls). ``structured`` is the
    ``response_format`` type the reply was generated under (``json_schema`` / ``json_object``), None for
    free text; ``format_fallback`` is True when the server refused the format and this reply is free text.
    """

    text: str
    finish_reason: str | None
    usage: Usage
    model: str
    attempts: int
    structured: str | None = None
    format_fallback: bool = False
    #: the tool calls the server returned in ``message.tool_calls`` (a forced ``tool_choice``, or a server that
    #: parses calls itself); () when none: callers that parse calls from ``text`` still do
    tool_calls: tuple[ToolCall, ...] = ()


def build_request(
    endpoint: LLMEndpointConfig,
    messages: Sequence[Message],
    temperature: float | None,
    max_tokens: int | None,
    stop: str | Sequence[str] | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """The SDK's ``chat.completions.create`` arguments: sampling defaults from ``endpoint``, ``extra`` keys
    sent verbatim in the JSON body. :class:`ValueError` for messages that are not a non-empty sequence."""
    if isinstance(messages, str | bytes) or not messages:
        raise ValueError("messages must be a non-empty sequence of {'role': ..., 'content': ...} mappings")
    request: dict[str, Any] = {
        "model": endpoint.model,
        "messages": [dict(m) for m in messages],
        "temperature": endpoint.temperature if temperature is None else temperature,
        "max_tokens": endpoint.max_tokens if max_tokens is None else max_tokens,
    }
    if stop is not None:
        request["stop"] = stop if isinstance(stop, str) else list(stop)
    if extra:
        request["extra_body"] = dict(extra)
    return request


def read_reply(response: Any, attempts: int, default_model: str) -> ChatResult:
    """An SDK response as a :class:`ChatResult`; a reply without a usable choice is retryable
    (:class:`RetryableFailure`)."""
    choices = getattr(response, "choices", None)
    if not choices:
        raise RetryableFailure(f"HTTP 200 without choices (malformed reply: {short(response)})")
    choice = choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise RetryableFailure(
            f"HTTP 200 whose first choice has no message (malformed reply: {short(response)})"
        )
    usage = getattr(response, "usage", None)
    return ChatResult(
        text=getattr(message, "content", None) or "",
        finish_reason=getattr(choice, "finish_reason", None),
        usage=Usage(
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        ),
        model=getattr(response, "model", None) or default_model,
        attempts=attempts,
        tool_calls=_tool_calls(getattr(message, "tool_calls", None)),
    )


def _tool_calls(calls: Any) -> tuple[ToolCall, ...]:
    """``message.tool_calls`` of an SDK reply as our :class:`ToolCall` (function calls only; an entry without a
    function name is skipped: there is nothing to call)."""
    found = []
    for call in calls or ():
        function = getattr(call, "function", None)
        name = getattr(function, "name", None)
        if not name:
            continue
        found.append(ToolCall(id=getattr(call, "id", None) or "",
                              function=ToolFunction(name=name, arguments=getattr(function, "arguments", None) or "{}")))
    return tuple(found)


def short(value: Any) -> str:
    """``str(value)`` cut to a length an error message can carry."""
    text = str(value)
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."
