"""Reading the agent's action: the assistant message of ``/step`` in any shape a client sends, and the tool
calls it asks for.

Two readers, because the two questions are answered in different places:

* :func:`read_action` (the service, once per ``/step``): the wire shapes. ``tool_calls`` may be OpenAI's
  ``{id, type: "function", function: {name, arguments}}`` (arguments a JSON string or an object), the
  reference's flat ToolCall ``{id, name, arguments, type: "tool", index}``, or its nested dump
  ``{id, <type>: {name, arguments}, type, index, result}``. All become one :class:`ChatMessage` with OpenAI
  ``tool_calls``, or a :class:`BadAction` whose message names the field -- never a raw pydantic dump.
* :func:`read_tool_calls` (each environment, in ``step``): what the message asks to call. Structured
  ``tool_calls`` win; without them, hermes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks in ``content`` are read, because that is how the reference agent (and any client that does not
  parse its model's text) acts. Environments call it themselves rather than the service rewriting the
  message, so an environment used directly (tests, other hosts) behaves the same, and each decides what a
  block it cannot read means for it (calc and codebox explain it; BFCL ends the turn, as BFCL does).

The text reader reuses the agent flow's hermes pieces (:func:`split_blocks`, :func:`call_from_json`), so
the trainer and the environments read ``<tool_call>`` blocks alike. It is lenient where a client cannot
repair the text: a block whose ``</tool_call>`` is missing (generation stopped at the tag) still counts
when its JSON is complete, and text after the JSON object inside a block is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agentevolver.module.tools.parsing.base import assign_call_ids
from agentevolver.module.tools.parsing.blocks import split_blocks
from agentevolver.module.tools.parsing.hermes import CLOSE_TAG, OPEN_TAG, call_from_json
from agentevolver.schema import ChatMessage, ToolCall
from env_service.errors import BadAction

__all__ = ["ActionCalls", "call_as_text", "read_action", "read_text_tool_calls", "read_tool_calls"]

_DECODER = json.JSONDecoder()
_HINT = 'write {"name": "<tool name>", "arguments": {...}} between <tool_call> and </tool_call>'


# ------------------------------------------------------------------------------------------- wire shapes
def _tool_call(raw: Any, where: str) -> dict[str, Any]:
    """One tool call of any accepted shape as an OpenAI tool call dict; BadAction naming ``where``."""
    if not isinstance(raw, Mapping):
        raise BadAction(f"{where} must be an object such as {{\"id\": ..., \"type\": \"function\", \"function\": "
                        f"{{\"name\": ..., \"arguments\": ...}}}}; got {type(raw).__name__}", field=where)
    kind = raw.get("type") if isinstance(raw.get("type"), str) and raw.get("type") else "function"
    key = "function" if isinstance(raw.get("function"), Mapping) else kind  # OpenAI's, or the dump's <type>
    nested = raw.get(key)
    source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else raw
    name = source.get("name")
    if not isinstance(name, str) or not name.strip():
        path = f"{where}.{key}.name" if source is not raw else f"{where}.name"
        raise BadAction(f"{path}: a tool call needs the tool's name (a non-empty string)", field=path)
    arguments = source.get("arguments")
    if arguments is None or arguments == "":
        arguments = "{}"
    if not isinstance(arguments, str | Mapping):
        raise BadAction(f"{where}.arguments of {name!r} must be a JSON object or its JSON string; got "
                        f"{type(arguments).__name__}", field=f"{where}.arguments")
    call_id = raw.get("id")
    return {"id": call_id if isinstance(call_id, str) else "", "type": "function",
            "function": {"name": name, "arguments": dict(arguments) if isinstance(arguments, Mapping) else arguments}}


def read_action(raw: Any) -> ChatMessage:
    """The assistant message of a ``/step`` body, whichever tool-call shape it uses.

    Raises :class:`BadAction` naming the field (``messages``, ``messages.role``,
    ``messages.tool_calls.0.name`` ...) for anything that is not one assistant message.
    """
    if not isinstance(raw, Mapping) or not raw:
        raise BadAction("messages must be one assistant message {role: \"assistant\", content, tool_calls?}",
                        field="messages")
    message = dict(raw)
    role = message.get("role")
    if role != "assistant":
        raise BadAction(f"messages.role must be 'assistant' (the agent's action); got {role!r}",
                        field="messages.role")
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise BadAction(f"messages.tool_calls must be a list of tool calls; got {type(calls).__name__}",
                            field="messages.tool_calls")
        message["tool_calls"] = [_tool_call(call, f"messages.tool_calls.{i}") for i, call in enumerate(calls)] or None
    try:
        return ChatMessage.model_validate(message)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(["messages", *(str(part) for part in first.get("loc", ()))])
        reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise BadAction(f"{path}: {reason}", field=path) from None


# ------------------------------------------------------------------------------------------- tool calls
@dataclass(frozen=True)
class ActionCalls:
    """The tool calls an action asks for, and why any ``<tool_call>`` block of its text could not be read.

    ``from_text`` says the calls were read from ``content`` (the message had no structured ``tool_calls``).
    Every call has an id, unique in the message: the client's own, else ``call_<step>_<i>`` by position
    (the agent flow's :func:`assign_call_ids`).
    """

    calls: list[ToolCall] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    from_text: bool = False


def read_text_tool_calls(content: str, step: int = 0) -> ActionCalls:
    """The hermes ``<tool_call>`` blocks of ``content``, in order (see the module docstring for leniency);
    calls get the positional ids ``call_<step>_<i>``."""
    _, blocks = split_blocks(content, OPEN_TAG, CLOSE_TAG)
    calls: list[ToolCall] = []
    problems: list[str] = []
    for block in blocks:
        where = f"{OPEN_TAG} block {block.number}"
        body = block.body.strip()
        try:
            payload, _ = _DECODER.raw_decode(body)
        except json.JSONDecodeError as err:
            problems.append(f"{where}: not valid JSON ({err.msg} at character {err.pos}): {body[:80]!r}; {_HINT}")
            continue
        result = call_from_json(payload, where)
        if isinstance(result, str):
            problems.append(result)
        else:
            calls.append(result)
    return ActionCalls(assign_call_ids(calls, step), problems, from_text=True)


def read_tool_calls(action: ChatMessage, step: int = 0) -> ActionCalls:
    """The calls ``action`` asks for: its ``tool_calls``, else the ``<tool_call>`` blocks of its content.

    ``step`` (the environment's step counter, if it keeps one) numbers the ids of calls that have none.
    """
    if action.tool_calls:
        return ActionCalls(assign_call_ids(action.tool_calls, step))
    if OPEN_TAG in action.content:
        return read_text_tool_calls(action.content, step)
    return ActionCalls()


def call_as_text(call: ToolCall) -> str:
    """One structured call written as the hermes block a text-acting agent would write."""
    try:
        arguments: Any = call.function.arguments_dict()
    except ValueError:
        arguments = call.function.arguments
    payload = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{payload}\n{CLOSE_TAG}"
