"""Structured outputs for the LLM roles: the schema a role's reply must follow, and whether to send it.

Why: every role parses JSON from free text and re-asks on failure; a small model writes valid JSON 0-20% of
the time when only asked, and 100% when the server constrains decoding to a schema (docs/llm.md,
"Structured outputs"). Servers that can (vLLM, SGLang, hosted OpenAI-compatible APIs, the local
``agentevolver.llm_server``) take ``response_format: {"type": "json_schema", ...}``; some take only
``json_object``; some take neither. ``llm.endpoints.<name>.structured_output`` says which:

* ``auto`` (default): send ``json_schema``; the first time the server refuses it (HTTP 400/422 naming
  ``response_format``), remember that for this endpoint, log it once, and send the request again without
  it: today's parse-and-re-ask path. No extra probe request is ever sent.
* ``json_schema`` / ``json_object``: always send that format; a refusal is an error that says to switch.
* ``off``: never send one (free text, parsed and re-asked as before).

Whatever the server did, the role still validates the reply against its pydantic model, so a server that
silently ignores ``response_format`` costs nothing but the re-asks it had before.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

__all__ = ["STRUCTURED_OUTPUT_MODES", "FormatState", "ReplySchema", "StructuredOutputMode", "is_format_refusal",
           "reply_schema"]

StructuredOutputMode = Literal["auto", "json_schema", "json_object", "off"]
STRUCTURED_OUTPUT_MODES: tuple[str, ...] = ("auto", "json_schema", "json_object", "off")

#: JSON Schema annotations left out of the wire schema: they constrain nothing and only lengthen requests
#: (pydantic turns class docstrings, written for developers, into descriptions).
_ANNOTATIONS = ("title", "description", "default", "examples")


@dataclass(frozen=True)
class ReplySchema:
    """A role's reply shape as sent in ``response_format`` (``name``: letters, digits, ``_``, ``-``)."""

    name: str
    schema: dict[str, Any]

    def response_format(self, kind: str) -> dict[str, Any]:
        """The ``response_format`` body for ``kind`` (``json_schema`` or ``json_object``)."""
        if kind == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.schema}}


def reply_schema(model: type[BaseModel], name: str | None = None, **overrides: dict[str, Any]) -> ReplySchema:
    """The wire schema of a role's pydantic reply model.

    Every property becomes required and no other property is allowed, so a constrained model writes each
    field once and nothing else (what OpenAI's strict mode also needs); titles, descriptions and defaults
    are dropped.
    ``overrides`` patch one property's schema (e.g. ``tasks={"maxItems": 3}``) for limits known per call.
    """
    schema = _strict(copy.deepcopy(model.model_json_schema()))
    for field, patch in overrides.items():
        if field not in schema.get("properties", {}):
            raise KeyError(f"reply_schema({model.__name__}): no property {field!r} to override")
        schema["properties"][field].update(patch)
    return ReplySchema(name or model.__name__, schema)


def _strict(schema: Any) -> Any:
    """Walk the schema's subschemas (not its property-name maps, where "title" may be a field)."""
    if not isinstance(schema, dict):
        return schema
    for key in _ANNOTATIONS:
        schema.pop(key, None)
    for key in ("items", "additionalProperties"):
        _strict(schema.get(key))
    for key in ("anyOf", "oneOf", "prefixItems"):
        for sub in schema.get(key) or []:
            _strict(sub)
    for key in ("properties", "$defs"):
        for sub in (schema.get(key) or {}).values():
            _strict(sub)
    if schema.get("type") == "object" and "properties" in schema:
        schema["required"] = list(schema["properties"])
        schema["additionalProperties"] = False
    return schema


def is_format_refusal(status: int, body: Any, message: str) -> bool:
    """Whether an HTTP error says the server does not take this ``response_format``.

    Servers answer 400 or 422 and name the field in OpenAI's ``param`` (this project's server, vLLM) or in
    the message (llama.cpp, FastAPI validation errors). Any other 4xx is a different problem.
    """
    if status not in (400, 422):
        return False
    error = body.get("error", body) if isinstance(body, dict) else None
    param = error.get("param") if isinstance(error, dict) else None
    return (isinstance(param, str) and param.startswith("response_format")) or "response_format" in message


class FormatState:
    """What one endpoint is known to take; shared by every role on it (thread-safe).

    ``kind()`` is the format to send now (``None`` = free text). In ``auto`` mode it starts as
    ``json_schema`` and becomes ``None`` after the first refusal.
    """

    def __init__(self, mode: StructuredOutputMode) -> None:
        self.mode = mode
        self._refused_with: str | None = None
        self._lock = threading.Lock()
        self.counts = {"structured_requests": 0, "format_fallbacks": 0}

    def kind(self) -> str | None:
        if self.mode == "off":
            return None
        if self.mode == "auto":
            with self._lock:
                return None if self._refused_with is not None else "json_schema"
        return self.mode

    def refused(self, reason: str) -> bool:
        """Record a refusal; True the first time (the caller logs it once)."""
        with self._lock:
            first = self._refused_with is None
            self._refused_with = self._refused_with or reason
            self.counts["format_fallbacks"] += 1
            return first

    def sent(self) -> None:
        with self._lock:
            self.counts["structured_requests"] += 1

    @property
    def refusal(self) -> str | None:
        """The server's message of the first refusal (None while none happened)."""
        return self._refused_with
