"""``minimax``: the call format of MiniMax-M1 / M2, as verl's ``minimax`` parser names it::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Paris</parameter>
    </invoke>
    </minimax:tool_call>

One block may hold several ``<invoke>`` calls; values are typed by the tool's schema (:mod:`.values`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.seed import xml_blocks

__all__ = ["MiniMaxParser"]

OPEN_TAG, CLOSE_TAG = "<minimax:tool_call>", "</minimax:tool_call>"
_INVOKE = re.compile(r'<invoke\s+name="([^"]*)"\s*>(.*?)(?:</invoke>|(?=<invoke\s)|\Z)', re.DOTALL)
_PARAMETER = re.compile(r'<parameter\s+name="([^"]*)"\s*>(.*?)</parameter>', re.DOTALL)
_HINT = ('write <minimax:tool_call><invoke name="NAME"><parameter name="ARG">value</parameter></invoke>'
         "</minimax:tool_call>")


@register_parser("minimax")
class MiniMaxParser(ToolCallParser):
    """Parse every ``<minimax:tool_call>`` block and each ``<invoke>`` inside it."""

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring."""
        return xml_blocks(text, OPEN_TAG, CLOSE_TAG, _INVOKE, _PARAMETER, '<invoke name="NAME">', _HINT, tools)
