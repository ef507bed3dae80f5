"""``tool_choice: "required"`` or a named function: the reply is decoded as a tool call, under a grammar.

Why: with ``tool_choice: "auto"`` a small model asked to call a tool often does not. The explorer of
Self-Questioning (SmolLM2-135M on calc, issue 43) answered in prose in about half its explorations, wrote tool
calls that were not JSON, and passed argument names the tool does not take ("value", "thickness_message"),
so those explorations observed nothing to write a task from. Servers users run (vLLM, SGLang, OpenAI) accept
a forced ``tool_choice`` and guarantee a call; this module does the same for the local server, with the
grammar machinery ``response_format`` uses (:mod:`.structured`).

The reply's JSON Schema (compact JSON, as every constrained reply here):

* ``required``: an array of at least one ``{"name": <a tool's name>, "arguments": <that tool's parameters>}``
  (one at most when ``parallel_tool_calls`` is false), the shape vLLM also decodes a required choice as;
* a named function: that function's arguments object alone.

Each tool's ``parameters`` must be a schema the grammar can enforce (a 400 names the field inside
``tools[i].function.parameters``); a tool without parameters takes an empty object. The decoded reply is
read back into ``message.tool_calls`` (``finish_reason: "tool_calls"``, no content). A reply cut by the token
limit is not a complete call: it comes back as text with ``finish_reason: "length"``, as an unforced one would.
"""

from __future__ import annotations

import json
from typing import Any

from agentevolver.llm_server.structured import check_schema
from agentevolver.schema.llm_wire import ChatCompletionRequest, NamedToolChoice

__all__ = ["call_schema", "read_calls"]

#: Where a compile error of the combined schema points (each tool's own schema is checked under its path first).
TOOL_CHOICE_PARAM = "tool_choice"

_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def call_schema(body: ChatCompletionRequest) -> dict[str, Any]:
    """The JSON Schema a forced ``tool_choice`` reply must follow (see the module docstring); a 400 naming the
    field when a tool's parameters cannot be enforced."""
    assert body.tools and body.forced_tool_choice  # the request model checked both
    parameters = {}
    for index, tool in enumerate(body.tools):
        schema = tool.function.parameters if tool.function.parameters is not None else _NO_PARAMETERS
        check_schema(schema, f"tools[{index}].function.parameters")
        parameters.setdefault(tool.function.name, schema)  # a repeated name: the first one, as the parser reads it
    if isinstance(body.tool_choice, NamedToolChoice):
        return parameters[body.tool_choice.function["name"]]
    calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
              "required": ["name", "arguments"]} for name, schema in parameters.items()]
    array: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
                             "minItems": 1}
    if body.parallel_tool_calls is False:
        array["maxItems"] = 1
    return array


def read_calls(text: str, tool_choice: Any) -> list[tuple[str, str]] | None:
    """``(name, arguments JSON)`` of each call a forced reply holds, or None when the text is not a complete
    call (a reply cut by the token limit). The arguments are the reply's own text, not parsed and written
    again: a number such as ``4E400`` stays as written rather than becoming ``Infinity``, which is not JSON."""
    decoder = json.JSONDecoder()
    text = text.strip()
    if isinstance(tool_choice, NamedToolChoice):
        try:
            value, end = decoder.raw_decode(text)
        except ValueError:
            return None
        return [(tool_choice.function["name"], text)] if isinstance(value, dict) and end == len(text) else None
    if not text.startswith("["):
        return None
    calls: list[tuple[str, str]] = []
    index = 1
    while True:
        try:
            item, end = decoder.raw_decode(text, index)
        except ValueError:
            return None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        calls.append((item["name"], _arguments_text(text[index:end], item)))
        rest = text[end:].lstrip()
        if rest == "]":
            return calls
        if not rest.startswith(","):
            return None
        index = len(text) - len(rest[1:].lstrip())


def _arguments_text(item_text: str, item: dict[str, Any]) -> str:
    """The ``arguments`` value of one decoded call as the reply wrote it: the grammar writes the item as
    ``{"name": <name>, "arguments": <object>}`` (the schema's order, no other key). Should the text differ,
    the parsed value is written again."""
    prefix = '{"name": ' + json.dumps(item["name"], ensure_ascii=False) + ', "arguments": '
    if item_text.startswith(prefix) and item_text.endswith("}"):
        return item_text[len(prefix):-1]
    return json.dumps(item.get("arguments", {}), ensure_ascii=False)
