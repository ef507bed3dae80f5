"""Conversations as the task manager's LLM roles see them.

Two jobs: (1) the explorer talks to an OpenAI-compatible server, so environment ``tool`` messages become
``user`` messages (a ``tool`` message whose call id no assistant ``tool_calls`` entry holds is rejected
by some servers, and the explorer's calls are parsed from its text, so the server never sees call ids);
(2) the summariser and the grader read a trajectory as one text block, each observation cut to
``max_observation_chars``, each move of a multi-seat environment labelled with its seat.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentevolver.module.tools import truncate_text
from agentevolver.schema import ChatMessage

__all__ = ["for_chat_server", "render_transcript"]

_SPEAKER = {"system": "environment (system)", "user": "environment", "tool": "environment (tool result)",
            "assistant": "agent"}


def for_chat_server(messages: Sequence[ChatMessage], max_chars: int, *, tagged_calls: bool = False) -> list[dict[str, str]]:
    """Plain ``{role, content}`` messages any chat server accepts: tool results as user messages.

    An assistant turn that holds only structured tool calls (the environment's worked demonstrations) is
    written out as text the explorer can imitate: with ``tagged_calls`` (the ``hermes`` parser reads the
    explorer's replies) as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, the format
    the parser and the environments' system prompts use; a model shown bare JSON lines copies them, and
    its calls are then never parsed (measured with SmolLM2 on calc: 0 tool results in 24 steps).
    """
    out: list[dict[str, str]] = []
    for message in messages:
        content = message.content
        if message.role in ("user", "tool"):
            content = truncate_text(content, max_chars)[0]
        if message.role == "tool":
            name = f" of {message.name}" if message.name else ""
            out.append({"role": "user", "content": f"[tool result{name}]\n{content}"})
        elif message.role == "assistant" and message.tool_calls and not content.strip():
            out.append({"role": "assistant", "content": _calls_text(message, tagged=tagged_calls)})
        else:
            out.append({"role": message.role, "content": content})
    return out


def render_transcript(messages: Sequence[ChatMessage | Mapping[str, Any]], max_chars: int) -> str:
    """One text block: ``[speaker] content`` per message, observations cut to ``max_chars``."""
    blocks = []
    for raw in messages:
        message = raw if isinstance(raw, ChatMessage) else ChatMessage.model_validate(
            {k: v for k, v in raw.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")})
        content = message.content
        if message.role != "assistant":
            content = truncate_text(content, max_chars)[0]
        elif message.tool_calls and not content.strip():
            content = _calls_text(message)  # the calls came as structured data, not in the text
        blocks.append(f"[{_speaker(message)}]\n{content.strip()}")
    return "\n\n".join(blocks)


def _speaker(message: ChatMessage) -> str:
    """Who wrote ``message``; a move of a multi-seat environment (an assistant message with ``name``, the seat
    that made it) names its seat, so a record where one explorer played every seat reads as who did what."""
    if message.role == "assistant" and message.name:
        return f"agent as {message.name}"
    return _SPEAKER[message.role]


def _calls_text(message: ChatMessage, tagged: bool = False) -> str:
    """The calls as JSON lines (arguments as an object when they are a JSON string), tagged if asked."""
    lines = []
    for call in message.tool_calls or []:
        arguments: object = call.function.arguments
        if isinstance(arguments, str):
            with contextlib.suppress(json.JSONDecodeError):
                arguments = json.loads(arguments)
        line = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
        lines.append(f"<tool_call>\n{line}\n</tool_call>" if tagged else line)
    return "\n".join(lines)
