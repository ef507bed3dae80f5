"""Answers in the shape the reference trainer reads (``params.shape: reference``, the default).

The reference's rollout worker asserts that ``/create`` opens with exactly two messages, system and user,
and renders prompts without passing tool schemas to the chat template; its agent flow asserts exactly one
observation message per ``/step`` and turns a ``tool`` observation into a user message only through its
own ToolCall dump. Environments here answer in a richer form (demonstrations as real turns, one ``tool``
message per call, nothing after the final step), which this framework's client asks for with
``params.shape: native``. This module turns the rich form into the reference's, losslessly for the text
a model sees:

* opening: the system prompt, then the tools (hermes ``<tools>`` block, as Qwen-style templates write it),
  then any demonstration turns rendered as a transcript, all in the system message; the task (the
  trailing user messages) in the user message;
* observation: one ``user`` message; tool results wrapped in ``<tool_response>`` blocks in call order, as
  Qwen-style chat templates render tool messages; an empty observation (the episode ended) says
  ``[CONVERSATION_COMPLETED]``, the reference BFCL environment's end marker.
"""

from __future__ import annotations

import json
from typing import Any

from agentevolver.schema import ChatMessage
from env_service.actions import call_as_text

__all__ = ["ENDED", "observation", "opening"]

#: The content of the one observation of a final step that had nothing else to say.
ENDED = "[CONVERSATION_COMPLETED]"

_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more of the functions below. Their signatures are listed as JSON "
    "inside <tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\nTo call a function, write a JSON object "
    "with its name and arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_EXAMPLES_INTRO = "# Examples\n\nWorked examples of earlier conversations, in the format to follow:"
_SPEAKERS = {"user": "User", "assistant": "Assistant", "tool": "Tool", "system": "System"}


def tool_response(content: str) -> str:
    """One tool result as a Qwen-style chat template shows it to the model."""
    return f"<tool_response>\n{content}\n</tool_response>"


def _tools_block(tools: list[dict[str, Any]]) -> str:
    return _TOOLS_INTRO.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))


def _transcript(messages: list[ChatMessage]) -> str:
    """Demonstration turns as text: who speaks, what they say, tool calls and results in hermes form."""
    lines = [_EXAMPLES_INTRO]
    for message in messages:
        parts = [message.content] if message.content else []
        parts += [call_as_text(call) for call in message.tool_calls or []]
        text = "\n".join(parts)
        if message.role == "tool":
            text = tool_response(message.content)
        lines.append(f"{_SPEAKERS[message.role]}: {text}")
    return "\n\n".join(lines)


def opening(state: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``/create``'s messages as exactly [system, user] (see the module docstring)."""
    messages = [ChatMessage.model_validate(m) for m in state]
    system = messages.pop(0).content if messages and messages[0].role == "system" else ""
    task: list[ChatMessage] = []
    while messages and messages[-1].role == "user":
        task.insert(0, messages.pop())
    parts = [system, _tools_block(tools) if tools else "", _transcript(messages) if messages else ""]
    return [{"role": "system", "content": "\n\n".join(part for part in parts if part)},
            {"role": "user", "content": "\n\n".join(m.content for m in task)}]


def observation(state: list[dict[str, Any]], terminated: bool) -> list[dict[str, Any]]:
    """``/step``'s observation as exactly one user message (see the module docstring)."""
    if len(state) == 1 and state[0].get("role") == "user":
        return state
    parts = [tool_response(str(m.get("content") or "")) if m.get("role") == "tool" else str(m.get("content") or "")
             for m in state]
    content = "\n".join(parts) if parts else (ENDED if terminated else "")
    return [{"role": "user", "content": content}]
