"""``gemma4``: Google Gemma 4's call format, as verl's ``gemma4`` parser names it::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>

Strings are delimited by ``<|"|>``; other values are bare (numbers, true/false/null) or nested objects
``{k:v}`` and lists ``[a,b]``, which this parser reads recursively (verl's regex stops at the first ``}``).
Gemma 4 does not end its turn after a call, so generation must stop at ``<tool_call|>``
(:attr:`stop_tokens`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agentevolver.module.tools.parsing.base import ParsedAction, ToolCallParser, ToolSchema, register_parser
from agentevolver.module.tools.parsing.blocks import join_content, split_blocks
from agentevolver.schema.message import ToolCall, ToolFunction

__all__ = ["Gemma4Parser", "parse_gemma_object"]

OPEN_TAG, CLOSE_TAG = "<|tool_call>", "<tool_call|>"
QUOTE = '<|"|>'
_NAME = re.compile(r"\s*call:([A-Za-z_][\w.\-]*)\s*")
_HINT = 'write <|tool_call>call:NAME{key:<|"|>text<|"|>,number:3}<tool_call|>'
_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")


class _Syntax(ValueError):
    """A malformed argument object; the message says where."""


def parse_gemma_object(text: str) -> tuple[dict[str, Any], int]:
    """Parse ``{...}`` at the start of ``text`` (after whitespace): ``(object, index after it)``."""
    reader = _Reader(text)
    reader.skip()
    value = reader.object()
    return value, reader.pos


class _Reader:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expect(self, char: str) -> None:
        self.skip()
        if not self.text.startswith(char, self.pos):
            found = self.text[self.pos : self.pos + 12] or "the end"
            raise _Syntax(f"expected {char!r} at character {self.pos}, found {found!r}")
        self.pos += len(char)

    def object(self) -> dict[str, Any]:
        self.expect("{")
        out: dict[str, Any] = {}
        self.skip()
        if self.text.startswith("}", self.pos):
            self.pos += 1
            return out
        while True:
            key = self.key()
            self.expect(":")
            if key in out:
                raise _Syntax(f"argument {key!r} given twice")
            out[key] = self.value()
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
                continue
            self.expect("}")
            return out

    def key(self) -> str:
        self.skip()
        if self.text.startswith(QUOTE, self.pos):
            return self.string()
        match = re.compile(r"[^:{}\[\],\s]+").match(self.text, self.pos)
        if match is None:
            raise _Syntax(f"expected an argument name at character {self.pos}")
        self.pos = match.end()
        return match.group(0)

    def string(self) -> str:
        self.pos += len(QUOTE)
        end = self.text.find(QUOTE, self.pos)
        if end < 0:
            raise _Syntax(f"string opened with {QUOTE} is never closed")
        value, self.pos = self.text[self.pos : end], end + len(QUOTE)
        return value

    def value(self) -> Any:
        self.skip()
        if self.text.startswith(QUOTE, self.pos):
            return self.string()
        if self.text.startswith("{", self.pos):
            return self.object()
        if self.text.startswith("[", self.pos):
            self.pos += 1
            items: list[Any] = []
            self.skip()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return items
            while True:
                items.append(self.value())
                self.skip()
                if self.text.startswith(",", self.pos):
                    self.pos += 1
                    continue
                self.expect("]")
                return items
        match = re.compile(r"[^,}\]]*").match(self.text, self.pos)
        raw = match.group(0).strip() if match else ""
        self.pos = match.end() if match else self.pos
        if not raw:
            raise _Syntax(f"missing value at character {self.pos}")
        return _bare(raw)


def _bare(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if _NUMBER.fullmatch(raw):
        return float(raw) if any(c in raw for c in ".eE") else int(raw)
    return raw


@register_parser("gemma4")
class Gemma4Parser(ToolCallParser):
    """Parse every ``<|tool_call>call:NAME{...}<tool_call|>`` block, in order."""

    stop_tokens = (CLOSE_TAG,)

    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """See the module docstring; values carry their own types."""
        pieces, blocks = split_blocks(text, OPEN_TAG, CLOSE_TAG)
        action = ParsedAction(content=join_content(pieces))
        for block in blocks:
            where = f"{OPEN_TAG} block {block.number}"
            if not block.terminated:
                action.errors.append(f"{where}: unterminated (no {CLOSE_TAG}); the call was not run")
                continue
            name = _NAME.match(block.body)
            if name is None:
                action.errors.append(f"{where}: expected call:NAME{{...}}; {_HINT}")
                continue
            try:
                arguments, end = parse_gemma_object(block.body[name.end() :])
            except _Syntax as err:
                action.errors.append(f"{where}: arguments of {name.group(1)!r}: {err}; {_HINT}")
                continue
            if block.body[name.end() + end :].strip():
                action.errors.append(f"{where}: unexpected text after the arguments of {name.group(1)!r}; {_HINT}")
                continue
            action.tool_calls.append(ToolCall(function=ToolFunction(name=name.group(1), arguments=arguments)))
        return action
