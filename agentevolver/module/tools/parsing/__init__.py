"""Parsers that turn one generated assistant message into a :class:`ParsedAction`.

Importing this package registers the built-in parsers (``hermes``, ``qwen3_coder``, ``python_code``,
``final_answer``, ``composite``) and one per model dialect that verl 0.9.1 ships a parser for, under verl's
name (``gpt-oss``, ``glm``, ``seed``, ``minimax``, ``kimi``, ``deepseek_v4``, ``gemma4``; docs/backends.md); a
plugin registers its own with ``@register_parser("name")`` and is chosen by the ``tool_parser`` config key
like any built-in.
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
from agentevolver.module.tools.parsing.deepseek_v4 import DeepSeekV4Parser
from agentevolver.module.tools.parsing.final_answer import FinalAnswerParser
from agentevolver.module.tools.parsing.gemma4 import Gemma4Parser
from agentevolver.module.tools.parsing.glm import GlmParser
from agentevolver.module.tools.parsing.gpt_oss import GptOssParser
from agentevolver.module.tools.parsing.hermes import HermesParser
from agentevolver.module.tools.parsing.kimi import KimiParser
from agentevolver.module.tools.parsing.minimax import MiniMaxParser
from agentevolver.module.tools.parsing.python_code import PythonCodeParser
from agentevolver.module.tools.parsing.qwen3_coder import Qwen3CoderParser
from agentevolver.module.tools.parsing.seed import SeedParser

__all__ = [
    "PARSERS",
    "CompositeParser",
    "DeepSeekV4Parser",
    "FinalAnswerParser",
    "Gemma4Parser",
    "GlmParser",
    "GptOssParser",
    "HermesParser",
    "KimiParser",
    "MiniMaxParser",
    "ParsedAction",
    "ParserSpec",
    "PythonCodeParser",
    "Qwen3CoderParser",
    "SeedParser",
    "ToolCallParser",
    "assign_call_ids",
    "build_parser",
    "call_id",
    "get_parser",
    "parser_names",
    "register_parser",
]
