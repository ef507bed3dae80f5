"""``kimi``: the special-token call format of Kimi K2, as verl's ``kimi`` parser names it::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call id ``functions.NAME:INDEX`` names the function; it is kept as the call's id, because Kimi's chat
template answers each call by that id. An id of another shape is taken as the name itself (verl's parser
then guesses the tool from the schemas; a wrong name here reaches the environment, which says so). Invalid
JSON arguments are an error line (verl's parser runs the call with ``{}``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content, split_blocks
from agentevolver.module.tools.parsing.values import json_object
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["KimiParser"]

SECTION_OPEN, SECTION_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
_CALL = re.compile(
    r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)(<\|tool_call_end\|>|(?=<\|tool_call_begin\|>)|\Z)",
    re.DOTALL,
)
_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$")
_HINT = ("write <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>"
         "{...JSON arguments...}<|tool_call_end|><|tool_calls_section_end|>")


@register_parser("kimi")
class KimiParser(ToolCallParser):
    """Parse the calls of every tool-calls section, in order."""

    stop_tokens = ("<|im_end|>",)

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring; ``tools`` is not needed (arguments are JSON)."""
        pieces, sections = split_blocks(text.replace("<|im_end|>", ""), SECTION_OPEN, SECTION_CLOSE)
        action = ParsedAction(content=join_content(pieces))
        for section in sections:
            calls = list(_CALL.finditer(section.body))
            if not calls:
                action.errors.append(f"tool-calls section {section.number}: no <|tool_call_begin|> call; {_HINT}")
                continue
            for index, call in enumerate(calls, start=1):
                where = f"tool-calls section {section.number}, call {index}"
                if not call.group(3):
                    action.errors.append(f"{where}: unterminated (no <|tool_call_end|>); the call was not run")
                    continue
                call_id = call.group(1).strip()
                match = _ID.match(call_id)
                name = match.group(1).strip() if match else ""
                if not name:
                    action.errors.append(f"{where}: no function name in the call id {call_id!r}; {_HINT}")
                    continue
                arguments = json_object(call.group(2), f"{where} ({name})", _HINT)
                if isinstance(arguments, str):
                    action.errors.append(arguments)
                    continue
                action.tool_calls.append(ToolCall(id=call_id, function=ToolFunction(name=name, arguments=arguments)))
        return action
