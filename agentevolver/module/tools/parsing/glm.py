"""``glm``: the call format of GLM-4.5 / 4.6 / 4.7 (Zhipu), as verl's ``glm`` parser names it::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    <arg_key>days</arg_key>
    <arg_value>3</arg_value>
    </tool_call>

The function name comes first, then key/value pairs; values are typed by the tool's schema
(:mod:`.values`). Generation stops at ``<|observation|>`` (GLM's "the tool answers now" token), which is
removed from the content. A block without a name, a key without a value or text between the pairs is an
error line, not a silently dropped call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content, split_blocks
from agentevolver.module.tools.parsing.values import schema_types, typed_value
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["GlmParser"]

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_SPECIALS = re.compile(r"<\|(?:observation|user|endoftext)\|>")
_HINT = "write <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>"


@register_parser("glm")
class GlmParser(ToolCallParser):
    """Parse every ``<tool_call>NAME<arg_key>...`` block, in order."""

    stop_tokens = ("<|observation|>",)

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring; ``tools`` (the prompt's schemas) decides which values stay strings."""
        types = schema_types(tools)
        pieces, blocks = split_blocks(text, OPEN_TAG, CLOSE_TAG)
        action = ParsedAction(content=_SPECIALS.sub("", join_content(pieces)).strip())
        for block in blocks:
            where = f"{OPEN_TAG} block {block.number}"
            if not block.terminated:
                action.errors.append(f"{where}: unterminated (no {CLOSE_TAG}); the call was not run")
                continue
            result = _call(block.body, where, types)
            if isinstance(result, str):
                action.errors.append(result)
            else:
                action.tool_calls.append(result)
        return action


def _call(body: str, where: str, types: dict[str, dict[str, str]]) -> ToolCall | str:
    first = body.find("<arg_key>")
    name = (body if first < 0 else body[:first]).strip()
    if not name or any(ch.isspace() for ch in name):
        return f"{where}: expected the function name first, got {name!r}; {_HINT}"
    declared = types.get(name, {})
    arguments: dict[str, Any] = {}
    rest = body[first:] if first >= 0 else ""
    for pair in _PAIR.finditer(rest):
        key = pair.group(1).strip()
        if not key:
            return f"{where}: function {name!r} has an argument without a key; {_HINT}"
        if key in arguments:
            return f"{where}: function {name!r} gives argument {key!r} twice"
        arguments[key] = typed_value(pair.group(2), declared.get(key))
    leftover = _PAIR.sub("", rest).strip()
    if leftover:
        return f"{where}: function {name!r}: unreadable text between the arguments {leftover[:80]!r}; {_HINT}"
    return ToolCall(function=ToolFunction(name=name, arguments=arguments))
