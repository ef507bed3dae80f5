"""The answers of the local LLM server, built as the ``openai`` SDK's own models (what the official client parses).

Kept apart from the routes: turning the generator's choices into OpenAI's shapes (tool calls parsed out of
the text, log-probs, usage, server-sent events) is one job, testable without a model or a server.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from openai.types import CompletionUsage
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

from agentevolver.llm_server.engine import Choice, TokenLogprob
from agentevolver.llm_server.forced_calls import read_calls

__all__ = ["chat_chunks", "chat_response", "completion_logprobs", "dump", "usage_of"]


def dump(model: Any) -> dict[str, Any]:
    """An SDK model as JSON, without the fields never set (what the OpenAI API leaves out)."""
    return model.model_dump(mode="json", exclude_unset=True)


def usage_of(prompt_tokens: int, choices: list[Choice]) -> CompletionUsage:
    """Token counts of a reply: the prompt once, every choice's completion."""
    completion = sum(choice.completion_tokens for choice in choices)
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion,
                           total_tokens=prompt_tokens + completion)


def chat_response(
    served_name: str, choices: list[Choice], usage: CompletionUsage, parser: Any, tools: list[dict[str, Any]] | None,
    forced: Any = None,
) -> ChatCompletion:
    """The chat completion of ``choices``: tool calls parsed from the text by ``parser`` (``tool_choice`` auto),
    or, with ``forced`` (the request's ``required`` / named ``tool_choice``), read from the grammar-decoded JSON
    (:func:`.forced_calls.read_calls`)."""
    out = []
    for index, choice in enumerate(choices):
        content: str | None = choice.text
        tool_calls = None
        finish = choice.finish_reason
        calls = read_calls(choice.text, forced) if forced is not None and finish != "length" else None
        if calls:
            content = None
            tool_calls = [ChatCompletionMessageFunctionToolCall(
                id=f"call_{uuid.uuid4().hex[:24]}", type="function", function={"name": name, "arguments": arguments})
                for name, arguments in calls]
            finish = "tool_calls"
        elif parser is not None and forced is None:
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


def completion_logprobs(items: list[TokenLogprob] | None) -> CompletionLogprobs | None:
    if items is None:
        return None
    offsets, position = [], 0
    for item in items:
        offsets.append(position)
        position += len(item.token)
    return CompletionLogprobs(tokens=[i.token for i in items], token_logprobs=[i.logprob for i in items],
                              text_offset=offsets, top_logprobs=None)


async def chat_chunks(response: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events for a finished reply: per choice a role chunk, its content, then its finish.

    The generator reports no tokens before a row ends, so the content arrives in one chunk; clients that
    only speak the streaming protocol still work, they just see no gradual output.
    """
    common = {"id": response.id, "object": "chat.completion.chunk", "created": response.created,
              "model": response.model}

    def event(choices: list[dict[str, Any]], **extra: Any) -> str:
        chunk = ChatCompletionChunk.model_validate({**common, "choices": choices, **extra})
        return f"data: {json.dumps(dump(chunk))}\n\n"

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
            logprobs = dump(choice.logprobs) if choice.logprobs is not None else None
            yield event([{"index": choice.index, "delta": delta, "finish_reason": None, "logprobs": logprobs}])
        yield event([{"index": choice.index, "delta": {}, "finish_reason": choice.finish_reason}])
    if include_usage and response.usage is not None:
        yield event([], usage=dump(response.usage))
    yield "data: [DONE]\n\n"

