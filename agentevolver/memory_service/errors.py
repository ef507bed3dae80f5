"""Errors of the memory service, each mapped to one HTTP status in one place (``app.py``).

Every error carries the request field to fix (when there is one), so the JSON error body can name it and a
client can show the user what to change instead of a traceback. The embedders' own failure,
:class:`agentevolver.embedders.EmbeddingFailed` (502), is answered by the same handler.
"""

from __future__ import annotations

from agentevolver.errors import AgentEvolverError
from agentevolver.service_errors import ServiceError


class MemoryServiceError(ServiceError, AgentEvolverError):
    """Base of the memory service's errors (status, code and field to fix: see ServiceError)."""


class BadRequest(MemoryServiceError):
    """A request value is wrong in a way the schema cannot express (depends on another field, a file, ...)."""

    status = 422
    code = "invalid_request"


class UnknownWorkspace(MemoryServiceError):
    """A workspace that must exist (the source of a copy) holds no memories."""

    status = 404
    code = "unknown_workspace"


class FileProblem(MemoryServiceError):
    """A dump/load path cannot be used: missing, not allowed, unreadable, or a line of it is malformed."""

    status = 400
    code = "bad_file"


class LLMNotConfigured(MemoryServiceError):
    """The request needs the LLM (summarisation, rerank, rewrite) but the service was started without one."""

    status = 503
    code = "llm_not_configured"


class LLMFailed(MemoryServiceError):
    """The LLM endpoint failed for good (after the client's retries); a later request may succeed."""

    status = 502
    code = "llm_failed"


class StoreMismatch(AgentEvolverError):
    """The data folder was built with another embedder (name or dimension) than the one configured.

    Raised at start-up, not per request: vectors of two embedders in one index would make every search
    silently wrong.
    """
