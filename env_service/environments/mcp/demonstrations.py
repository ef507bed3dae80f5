"""Demonstrations from nothing: worked examples of a tool server's tools, made by calling them for real.

A small policy learns tool use from the examples in its opening: calc's 8 demonstrations are why SmolLM2 calls
calc's tool, and with a bare opening it answered every ``mcp`` episode in one turn without calling its tool
(16 of 16 on the time server). A user's own server comes with no demonstrations, so the environment makes
them once at start-up, for the tools the config names (``demonstrations``; a deliberate choice, since each is
called for real):

- the arguments are the config's, or derived from the tool's input schema: each required property's
  ``examples``, ``default``, ``enum`` or ``const``, else the first quoted example in its description
  ("e.g. 'America/New_York'"), else a number's ``minimum`` (or 1) and ``false`` for a boolean; a property none
  of these gives is an error naming it and the config key to set;
- the tool is called on the real server, and its real result is what the demonstration shows;
- the conversation is question, tool call, tool result, final answer, as chat messages, so the policy's own
  chat template renders it exactly as it renders the episode's own turns.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentevolver.schema import ChatMessage

__all__ = ["Demonstration", "DemonstrationConfig", "demonstration_messages", "derive_arguments", "fill_answer"]

#: How much of a tool result a demonstration's final answer repeats.
_ANSWER_CHARS = 300
#: "e.g. 'X'", "e.g., \"X\"", "such as 'X'", "for example `X`": the first example a description quotes.
_QUOTED_EXAMPLE = re.compile(r"(?:e\.g\.,?|for example,?|such as|example:)\s*['\"`]([^'\"`]+)['\"`]", re.I)


class DemonstrationConfig(BaseModel):
    """One demonstration in the config: ``{tool, arguments?, question?, answer?}`` (or just the tool's name)."""

    model_config = ConfigDict(extra="forbid")

    #: The tool, by the name the agent sees (with its server's prefix when names collide).
    tool: str = Field(min_length=1)
    #: Its arguments (default: derived from the tool's input schema; module docstring).
    arguments: dict[str, Any] | None = None
    #: The demonstration's question (default: the tool's description with the arguments).
    question: str | None = None
    #: Its final answer (default: the start of the tool's real result). ``{a.b}`` in it is field ``a.b`` of the
    #: result's JSON, so an answer can quote the real result: ``"{target.datetime}"``.
    answer: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_alone(cls, value: Any) -> Any:
        return {"tool": value} if isinstance(value, str) else value


class Demonstration(BaseModel):
    """A made demonstration: the call and its real result."""

    tool: str
    arguments: dict[str, Any]
    question: str
    result: str
    answer: str


def derive_arguments(schema: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Arguments for a call from an input schema (module docstring), and the required properties it could not
    fill."""
    properties = schema.get("properties") or {}
    arguments: dict[str, Any] = {}
    missing: list[str] = []
    for name in schema.get("required") or []:
        value = _example_value(properties.get(name) or {})
        if value is _NONE:
            missing.append(name)
        else:
            arguments[name] = value
    return arguments, missing


_NONE = object()


def _example_value(prop: dict[str, Any]) -> Any:
    for key in ("examples", "enum"):
        if prop.get(key):
            return prop[key][0]
    for key in ("default", "const"):
        if key in prop:
            return prop[key]
    quoted = _QUOTED_EXAMPLE.search(str(prop.get("description") or ""))
    kind = prop.get("type")
    if quoted and kind in (None, "string"):
        return quoted.group(1)
    if kind in ("integer", "number"):
        return prop.get("minimum", 1)
    if kind == "boolean":
        return False
    return _NONE


def default_question(tool: str, description: str, arguments: dict[str, Any]) -> str:
    """``<the description's first sentence> (<argument>: <value>, ...)``, or the tool's name when it has none."""
    first = re.split(r"(?<=[.!?])\s|\n", description.strip(), maxsplit=1)[0].rstrip(".") if description else ""
    shown = ", ".join(f"{key}: {value}" for key, value in arguments.items())
    what = first or f"Use {tool}"
    return f"{what} ({shown})" if shown else what


def demonstration_messages(demos: list[Demonstration]) -> list[ChatMessage]:
    """The demonstrations as the conversation the opening shows before the task's question."""
    messages: list[ChatMessage] = []
    for index, demo in enumerate(demos, 1):
        call_id = f"demo_{index}"
        call = {"id": call_id, "type": "function",
                "function": {"name": demo.tool, "arguments": json.dumps(demo.arguments, ensure_ascii=False)}}
        messages += [
            ChatMessage(role="user", content=demo.question),
            ChatMessage.model_validate({"role": "assistant", "content": "", "tool_calls": [call]}),
            ChatMessage(role="tool", content=demo.result, tool_call_id=call_id, name=demo.tool),
            ChatMessage(role="assistant", content=demo.answer),
        ]
    return messages


def fill_answer(template: str, result: str) -> str:
    """``template`` with each ``{a.b}`` replaced by field ``a.b`` of the JSON ``result``; a ``ValueError`` names a
    field the result does not have (or a result that is not JSON)."""
    fields = re.findall(r"\{([A-Za-z0-9_.]+)\}", template)
    if not fields:
        return template
    try:
        data = json.loads(result)
    except json.JSONDecodeError as err:
        raise ValueError(f"the answer quotes {{{fields[0]}}}, but the tool's result is not JSON") from err
    for path in fields:
        value: Any = data
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise ValueError(f"the answer quotes {{{path}}}, which the tool's result does not have")
            value = value[key]
        template = template.replace(f"{{{path}}}", str(value))
    return template


def final_answer_text(result: str, marker: str) -> str:
    """A demonstration's last turn: the marker and the start of the tool's result, on one line."""
    text = " ".join(result.split())
    if len(text) > _ANSWER_CHARS:
        text = text[:_ANSWER_CHARS] + " ..."
    return f"{marker}: {text}"
