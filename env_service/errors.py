"""Errors of the environment service, each mapped to one HTTP status in one place (``app.py``).

Environments raise these to say "the caller did something wrong" (``BadAction``, ``UnknownTask``); the
service raises the rest. Every one carries the request field to fix, so the JSON error can name it.
"""

from __future__ import annotations

from agentevolver.service_errors import ServiceError


class EnvServiceError(ServiceError):
    """Base of the environment service's errors (status, code and field to fix: see ServiceError)."""


class UnknownEnv(EnvServiceError):
    """``env_type`` names no environment loaded in this service."""

    status = 404
    code = "unknown_env"


class EnvUnavailable(EnvServiceError):
    """The environment exists but cannot run here (its package or data is missing); the message says how to fix."""

    status = 503
    code = "env_unavailable"


class UnknownTask(EnvServiceError):
    """``task_id`` is not a task of the environment."""

    status = 404
    code = "unknown_task"


class UnknownSplit(EnvServiceError):
    """``params.split`` is not a split of the environment."""

    status = 404
    code = "unknown_split"


class UnknownInstance(EnvServiceError):
    """``instance_id`` names no live instance (never created, released, or reaped after idling)."""

    status = 404
    code = "unknown_instance"


class DuplicateInstance(EnvServiceError):
    """A client-chosen ``instance_id`` is already live."""

    status = 409
    code = "duplicate_instance"


class BadAction(EnvServiceError):
    """The action in ``messages`` cannot be applied (wrong shape, unknown tool, bad arguments)."""

    status = 422
    code = "bad_action"


class TooManyInstances(EnvServiceError):
    """The service holds its maximum number of live instances; release some or retry later."""

    status = 429
    code = "too_many_instances"


class InstanceFailed(EnvServiceError):
    """The instance crashed, hung past the call timeout, or raised; it is gone, others are unaffected."""

    status = 502
    code = "instance_failed"


class InstanceTimeout(InstanceFailed):
    """A call on the instance ran past the per-call timeout; the instance was stopped."""

    status = 504
    code = "instance_timeout"


class InstanceGone(EnvServiceError):
    """The instance failed earlier (crash or timeout) and cannot serve more calls; release it."""

    status = 410
    code = "instance_gone"
