"""The one error detail every service of this project answers with (env service, memory service).

Each service wraps it in its own envelope (the env service's ``{success, data, error}``, ReMe's ``{success,
answer, metadata, error}``), but what went wrong is described the same way everywhere, so a client reads a
failure of any service with one model.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["ErrorDetail"]


class ErrorDetail(BaseModel):
    """Why a request failed: a short machine-readable code, a message that says what to change, the field to fix."""

    code: str
    message: str
    field: str | None = None
