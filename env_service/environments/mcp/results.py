"""Between the agent and a tool: arguments checked against the tool's input schema before the call, and the
SDK's ``CallToolResult`` turned into the text of a ``tool`` message.

Checking before the call means a server never sees arguments its own schema rejects (some servers crash on
them, some answer with a traceback), and the agent is told which field is wrong in one sentence. A result
keeps everything the model can read: text blocks, structured content (as JSON, when the text does not
already say it), and placeholders for images, audio and resources. A tool error (``isError``) stays an
error: its message starts with ``Error:`` and the step's ``info`` counts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

#: Prefix of every observation that reports a failed call (tool error, schema error, timeout).
ERROR_PREFIX = "Error:"


def schema_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` violate ``schema``, naming the field (``arguments.timezone: ...``); None if valid."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        validator_cls = jsonschema.validators.validator_for(schema)
        validator = validator_cls(schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: (len(e.absolute_path), str(e.message)))
    except jsonschema.exceptions.SchemaError:
        return None  # the server's schema is broken: let the server judge its arguments
    if not errors:
        return None
    first = errors[0]
    path = ".".join(str(part) for part in first.absolute_path)
    if first.validator == "required":
        missing = first.message.split("'")[1] if "'" in first.message else first.message
        return f"arguments.{missing} is required"
    if first.validator == "additionalProperties":
        return f"arguments: {first.message}"
    return f"arguments{'.' + path if path else ''}: {first.message}"


@dataclass(frozen=True)
class Observation:
    """The text of one ``tool`` message and what it was."""

    text: str
    is_error: bool
    truncated: int = 0  # characters cut


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        return str(text) if text is not None else f"[resource {resource.uri} ({getattr(resource, 'mime_type', '')})]"
    if kind == "resource_link":
        return f"[resource link {block.uri}]"
    return f"[{kind or 'content'} omitted ({getattr(block, 'mime_type', None) or 'binary'})]"


def render_result(result: Any, limit: int) -> Observation:
    """``CallToolResult`` -> observation text, cut to ``limit`` characters with a note saying how much."""
    parts = [_block_text(block) for block in (result.content or [])]
    text = "\n".join(part for part in parts if part)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        dumped = json.dumps(structured, ensure_ascii=False, sort_keys=True)
        if not text:
            text = dumped
        elif not _same_json(text, structured):
            text = f"{text}\n[structured content] {dumped}"
    is_error = bool(getattr(result, "is_error", False))
    if is_error and not text.startswith(ERROR_PREFIX):
        text = f"{ERROR_PREFIX} {text or 'the tool reported an error without a message'}"
    return cut(text, limit, is_error)


def cut(text: str, limit: int, is_error: bool = False) -> Observation:
    """``text`` within ``limit`` characters; a cut one ends with a note saying how many were left out."""
    if len(text) <= limit:
        return Observation(text, is_error)
    dropped = len(text) - limit
    note = f"\n[result cut: {dropped} of {len(text)} characters left out (servers.<name>.max_result_chars)]"
    return Observation(text[:limit] + note, is_error, dropped)


def _same_json(text: str, structured: Any) -> bool:
    """Whether the text already says what the structured content does (so it is not repeated): the same
    JSON, or the SDK's ``{"result": value}`` wrapping of a plain return value."""
    if isinstance(structured, dict) and list(structured) == ["result"] and str(structured["result"]) == text:
        return True
    try:
        return json.loads(text) == structured
    except (ValueError, TypeError):
        return False
