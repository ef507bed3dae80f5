"""The one error type every route of the local LLM server answers with, and how validation errors become it.

The request and answer models are the server's wire contract and live in :mod:`agentevolver.schema.llm_wire`;
this module holds what only the server needs: :class:`ServerError` (OpenAI's ``{"error": {message, type,
param, code}}`` with a status) and the translation of pydantic's error list into one 400 that names the
first field at fault.
"""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel

from agentevolver.schema.llm_wire import FieldError

__all__ = ["INVALID_REQUEST", "ServerError", "validation_error_to_server_error"]

#: OpenAI's ``error.type`` for a request the server refuses as written.
INVALID_REQUEST = "invalid_request_error"


class ServerError(Exception):
    """An error answered as OpenAI's ``{"error": {message, type, param, code}}`` with ``status``.

    ``param`` names the request field at fault (dotted for nested ones), so a client can show the user
    which field to change; the message says how.
    """

    def __init__(
        self, status: int, message: str, *, param: str | None = None, type_: str = INVALID_REQUEST,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def validation_error_to_server_error(
    errors: list[dict[str, Any]], model: type[BaseModel] | None = None
) -> ServerError:
    """Turn pydantic / FastAPI error dicts into a 400 naming the first field at fault.

    ``errors`` come from ``ValidationError.errors()`` or ``RequestValidationError.errors()`` (whose
    locations start with ``"body"``). All problems are listed in the message; ``param`` is the first.
    """
    messages: list[str] = []
    first: str | None = None
    for error in errors:
        loc = [str(part) for part in error.get("loc", ()) if part != "body" and not _is_type_tag(part)]
        kind = error.get("type", "")
        ctx = error.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, FieldError):
            field, text = cause.field, cause.message
        elif kind == "json_invalid":
            field, text = "body", f"the body is not valid JSON ({ctx.get('error', error.get('msg'))})"
        elif kind == "extra_forbidden":
            field = ".".join(loc)
            text = f"unknown field {field!r}{_close_match(loc[-1] if loc else '', model)}"
        elif not loc and kind in ("missing", "model_attributes_type", "dict_type", "model_type"):
            field, text = "body", "the body must be a JSON object (sent with Content-Type: application/json)"
        else:
            field = ".".join(loc) or "body"
            got = error.get("input")
            shown = "" if kind == "missing" or isinstance(got, dict | list) else f" (got {got!r})"
            text = f"{field}: {_plain(error.get('msg', 'invalid'))}{shown}"
        first = first or field
        if text not in messages:
            messages.append(text)
    return ServerError(400, "; ".join(messages) or "invalid request", param=first)


def _is_type_tag(part: Any) -> bool:
    """pydantic puts union branch names (``str``, ``list[TextPart]``, ``ToolIn``) into error locations."""
    if not isinstance(part, str):
        return False
    return "[" in part or part in ("str", "int", "float", "bool", "list", "dict") or part[:1].isupper()


def _plain(message: str) -> str:
    return message.removeprefix("Value error, ")


def _close_match(name: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return ""
    close = difflib.get_close_matches(name, list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; accepted fields: {', '.join(sorted(model.model_fields))}"
