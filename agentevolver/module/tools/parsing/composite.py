"""``composite``: several parsers applied in the configured order, e.g. ``["hermes", "final_answer"]``.

Each part parses the content the previous part left (its blocks removed), so the order decides which
reading wins when formats overlap: with ``["python_code", "final_answer"]`` code blocks are run and a
``FINAL ANSWER:`` printed *inside* one is not an answer; with ``["final_answer", "python_code"]`` a fenced
block after the marker is the answer, and only code before the marker is run. Calls keep the parts' order,
errors are concatenated, and the first part that finds a final answer provides it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentevolver.errors import ConfigError
from agentevolver.module.tools.parsing.base import (
    ParsedAction,
    ToolCallParser,
    ToolSchema,
    build_parser,
    register_parser,
)

__all__ = ["CompositeParser"]


@register_parser("composite")
class CompositeParser(ToolCallParser):
    """Run ``parsers`` (names, option mappings or parser objects) one after the other on the remaining text."""

    def __init__(self, parsers: Sequence[Any]) -> None:
        """Build each part now, so a bad name fails at start-up rather than mid-rollout."""
        if isinstance(parsers, str) or not parsers:
            raise ConfigError(f"composite tool parser needs a non-empty list of parsers; got {parsers!r}")
        self.parts: list[ToolCallParser] = [build_parser(part) for part in parsers]
        self.stop_tokens = tuple(dict.fromkeys(token for part in self.parts for token in part.stop_tokens))

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring."""
        merged = ParsedAction(content=text)
        for part in self.parts:
            action = part.extract(merged.content, tools)
            merged.content = action.content
            merged.tool_calls.extend(action.tool_calls)
            merged.errors.extend(action.errors)
            if merged.final_answer is None:
                merged.final_answer = action.final_answer
        merged.content = merged.content.strip()
        return merged
