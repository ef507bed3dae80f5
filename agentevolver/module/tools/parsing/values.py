"""Typing the argument values of text-form tool calls, shared by the dialect parsers.

XML-style dialects (qwen3_coder, glm, seed, minimax, deepseek_v4, gemma4) write each argument as text. The
model's chat template writes a string parameter raw and any other value as JSON, so the parser reads a value
back the same way: raw when the tool's schema declares the parameter a string, otherwise JSON when it parses
and the trimmed text when it does not (schema validation downstream then reports a wrong type to the
model). Without a schema every value that parses as JSON is JSON (``"42"`` becomes 42), as vLLM's and
verl's parsers read them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["STRING_TYPES", "SchemaTypes", "json_object", "schema_types", "trim_newlines", "typed_value"]

#: Schema ``type`` names whose values the templates write raw (no JSON quoting).
STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})

#: tool name -> parameter name -> its schema ``type`` (lower case; "" when the schema gives none).
SchemaTypes = dict[str, dict[str, str]]


def schema_types(tools: Sequence[Mapping[str, Any]] | None) -> SchemaTypes:
    """The declared parameter types of the prompt's tool schemas (OpenAI function format or bare functions)."""
    out: SchemaTypes = {}
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        properties = (function.get("parameters") or {}).get("properties") or {}
        out[function["name"]] = {
            str(name): str(prop.get("type", "")).lower() if isinstance(prop, Mapping) else ""
            for name, prop in properties.items()
        }
    return out


def trim_newlines(raw: str) -> str:
    """Drop the one line break a template puts after an opening and before a closing tag."""
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def typed_value(raw: str, declared: str | None) -> Any:
    """One argument value (see the module docstring); ``declared`` is the schema type or None if unknown."""
    if declared in STRING_TYPES:
        return trim_newlines(raw)
    text = raw.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def json_object(raw: str, where: str, hint: str) -> dict[str, Any] | str:
    """Arguments written as one JSON object (empty text = no arguments), or an error line naming ``where``."""
    text = raw.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"{where}: arguments are not valid JSON ({err}); {hint}"
    if not isinstance(value, dict):
        return f"{where}: arguments must be a JSON object, got {type(value).__name__}; {hint}"
    return value
