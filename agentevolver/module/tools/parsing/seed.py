"""``seed``: the call format of ByteDance Seed-OSS, as verl's ``seed`` parser names it::

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Paris</parameter>
    <parameter=days>3</parameter>
    </function>
    </seed:tool_call>

Like ``qwen3_coder`` with Seed's own block tags; one block may hold several functions (verl's parser keeps
only the first). Values are typed by the tool's schema (:mod:`.values`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content, split_blocks
from agentevolver.module.tools.parsing.values import schema_types, typed_value
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["SeedParser"]

OPEN_TAG, CLOSE_TAG = "<seed:tool_call>", "</seed:tool_call>"
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|(?=<function=)|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)
_HINT = "write <seed:tool_call><function=NAME><parameter=ARG>value</parameter></function></seed:tool_call>"


@register_parser("seed")
class SeedParser(ToolCallParser):
    """Parse every ``<seed:tool_call>`` block and each ``<function=...>`` inside it."""

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring."""
        return xml_blocks(text, OPEN_TAG, CLOSE_TAG, _FUNCTION, _PARAMETER, "<function=NAME>", _HINT, tools)


def xml_blocks(text: str, open_tag: str, close_tag: str, function: re.Pattern[str], parameter: re.Pattern[str],
               function_form: str, hint: str, tools: Sequence[ToolSchema] | None) -> ParsedAction:
    """Every ``open_tag ... close_tag`` block of ``text``, each holding calls that ``function`` matches (name,
    body) with ``parameter`` matches (key, raw value) in the body; shared by the XML-style dialects."""
    types = schema_types(tools)
    pieces, blocks = split_blocks(text, open_tag, close_tag)
    action = ParsedAction(content=join_content(pieces))
    for block in blocks:
        where = f"{open_tag} block {block.number}"
        if not block.terminated:
            action.errors.append(f"{where}: unterminated (no {close_tag}); the call was not run")
            continue
        calls = list(function.finditer(block.body))
        if not calls:
            action.errors.append(f"{where}: no {function_form} inside; {hint}")
            continue
        for call in calls:
            result = xml_call(call.group(1).strip(), parameter.finditer(call.group(2)), where, types, hint)
            if isinstance(result, str):
                action.errors.append(result)
            else:
                action.tool_calls.append(result)
    return action


def xml_call(name: str, parameters: Any, where: str, types: dict[str, dict[str, str]], hint: str) -> ToolCall | str:
    """One call from a function name and its ``(key, raw value)`` regex matches, or an error line."""
    if not name:
        return f"{where}: empty function name; {hint}"
    declared = types.get(name, {})
    arguments: dict[str, Any] = {}
    for parameter in parameters:
        key = parameter.group(1).strip()
        if not key:
            return f"{where}: function {name!r} has a parameter without a name; {hint}"
        if key in arguments:
            return f"{where}: function {name!r} gives parameter {key!r} twice"
        arguments[key] = typed_value(parameter.group(2), declared.get(key))
    return ToolCall(function=ToolFunction(name=name, arguments=arguments))
