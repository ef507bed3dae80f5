"""``deepseek_v4``: DeepSeek-V4's DSML call format, as verl's ``deepseek_v4`` parser names it::

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

(the bars are the full-width ``｜``). ``string="true"`` marks a raw string, ``string="false"`` a JSON value;
a value marked JSON that does not parse is an error line (verl's parser passes the raw text on). The
end-of-sentence token is removed from the content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content, split_blocks
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["DeepSeekV4Parser"]

DSML = "｜DSML｜"
OPEN_TAG, CLOSE_TAG = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"
EOS = "<｜end▁of▁sentence｜>"
_D = re.escape(DSML)
_INVOKE = re.compile(rf'<{_D}invoke\s+name="([^"]*)"\s*>(.*?)(?:</{_D}invoke>|(?=<{_D}invoke\s)|\Z)', re.DOTALL)
_PARAMETER = re.compile(rf'<{_D}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>(.*?)</{_D}parameter>',
                        re.DOTALL)
_HINT = (f'write {OPEN_TAG}<{DSML}invoke name="NAME"><{DSML}parameter name="ARG" string="true">value'
         f"</{DSML}parameter></{DSML}invoke>{CLOSE_TAG}")


@register_parser("deepseek_v4")
class DeepSeekV4Parser(ToolCallParser):
    """Parse every DSML ``tool_calls`` block and each ``invoke`` inside it."""

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring; types come from the ``string`` attribute, not the schema."""
        pieces, blocks = split_blocks(text.replace(EOS, ""), OPEN_TAG, CLOSE_TAG)
        action = ParsedAction(content=join_content(pieces))
        for block in blocks:
            where = f"DSML tool_calls block {block.number}"
            if not block.terminated:
                action.errors.append(f"{where}: unterminated (no {CLOSE_TAG}); the call was not run")
                continue
            invokes = list(_INVOKE.finditer(block.body))
            if not invokes:
                action.errors.append(f"{where}: no invoke inside; {_HINT}")
                continue
            for invoke in invokes:
                result = _call(invoke.group(1).strip(), invoke.group(2), where)
                if isinstance(result, str):
                    action.errors.append(result)
                else:
                    action.tool_calls.append(result)
        return action


def _call(name: str, body: str, where: str) -> ToolCall | str:
    if not name:
        return f"{where}: empty function name; {_HINT}"
    arguments: dict[str, Any] = {}
    for key, is_string, raw in _PARAMETER.findall(body):
        if key in arguments:
            return f"{where}: function {name!r} gives parameter {key!r} twice"
        if is_string == "true":
            arguments[key] = raw
            continue
        try:
            arguments[key] = json.loads(raw)
        except json.JSONDecodeError as err:
            return (f'{where}: parameter {key!r} of {name!r} is marked string="false" but is not JSON ({err}); '
                    'write string="true" for a text value')
    return ToolCall(function=ToolFunction(name=name, arguments=arguments))
