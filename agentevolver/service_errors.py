"""The base of the errors the framework's HTTP services (environment, memory) answer requests with.

Kept apart from :mod:`agentevolver.service_common` so that what raises these errors -- environment code,
including the child processes and Ray actors instances run in -- does not import the web stack.
"""

from __future__ import annotations

__all__ = ["ServiceError"]


class ServiceError(Exception):
    """Base: an error with an HTTP status, a short machine-readable code, and the field to fix (if any).

    Each service derives its own family and maps all of it to a JSON error in one handler
    (:func:`agentevolver.service_common.install_error_handlers`).
    """

    status: int = 400
    code: str = "bad_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        # Keep ``field`` when the error crosses a process boundary (process and Ray hosts pickle it).
        return (self.__class__, (self.message,), {"field": self.field})
