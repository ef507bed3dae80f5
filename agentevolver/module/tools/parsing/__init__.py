"""Parsers that turn one generated assistant message into a :class:`ParsedAction`.

Importing this package registers the built-in parsers (``hermes``, ``qwen3_coder``, ``python_code``,
``final_answer``, ``composite``); a plugin registers its own with ``@register_parser("name")`` and is chosen
by the ``tool_parser`` config key like any built-in.
"""

from agentevolver.module.tools.parsing.base import (
    PARSERS,
    ParsedAction,
    ParserSpec,
    ToolCallParser,
    assign_call_ids,
    build_parser,
    call_id,
    get_parser,
    parser_names,
    register_parser,
)
from agentevolver.module.tools.parsing.composite import CompositeParser
from agentevolver.module.tools.parsing.final_answer import FinalAnswerParser
from agentevolver.module.tools.parsing.hermes import HermesParser
from agentevolver.module.tools.parsing.python_code import PythonCodeParser
from agentevolver.module.tools.parsing.qwen3_coder import Qwen3CoderParser

__all__ = [
    "PARSERS",
    "CompositeParser",
    "FinalAnswerParser",
    "HermesParser",
    "ParsedAction",
    "ParserSpec",
    "PythonCodeParser",
    "Qwen3CoderParser",
    "ToolCallParser",
    "assign_call_ids",
    "build_parser",
    "call_id",
    "get_parser",
    "parser_names",
    "register_parser",
]
