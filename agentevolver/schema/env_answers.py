"""The answers of the environment service's routes: what the service sends and what the client reads.

One model per route. The service (:mod:`env_service.routes`) returns these models and FastAPI validates and
serialises them on the way out (each route's ``response_model``, which is also what ``/docs`` shows and
what ``tests/test_fuzz_env_service.py`` checks answers against); :class:`~agentevolver.client.env_client.EnvClient`
parses the same models, so the two cannot drift.

The wire is the reference's: a success is ``{success: true, data: ...}`` with no ``error`` key, an error
``{success: false, data: null, error: {code, message, field}}`` (:class:`ErrorAnswer`, written by the
service's error handlers). The routes that pass on what an environment said (``/create``, ``/step``) are
serialised with ``exclude_unset``, so a key the environment did not send (a message's ``tool_calls``, the
reference's absent ``info.env_type``) stays absent instead of appearing as ``null`` or a default; every
answer therefore constructs ``success`` explicitly (:meth:`Answer.of`).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict

from agentevolver.schema.env_wire import CreateData, StepData
from agentevolver.schema.error import ErrorDetail
from agentevolver.schema.step_labels import EnvCapabilities, StepLabelsData
from agentevolver.schema.task_writing import TaskWritingData

__all__ = [
    "Answer",
    "CapabilitiesAnswer",
    "CreateAnswer",
    "EnvListing",
    "EnvsAnswer",
    "ErrorAnswer",
    "EvaluateAnswer",
    "InfoAnswer",
    "Isolation",
    "ProfileAnswer",
    "ReleaseAnswer",
    "ServiceStats",
    "StatsAnswer",
    "StepAnswer",
    "StepLabelsAnswer",
    "TaskWritingAnswer",
    "ToolsAnswer",
]

#: Where an environment's instances run: in the service process, a process each, or a Ray actor each.
Isolation = Literal["inline", "process", "ray"]

T = TypeVar("T")


class Answer(BaseModel, Generic[T]):
    """A success: ``{success: true, data: <T>}``. Each route's answer is a named subclass (one OpenAPI
    component each); ``success`` is required so it is always set, and therefore always sent."""

    success: Literal[True]
    data: T

    @classmethod
    def of(cls, data: Any) -> Self:
        """The answer carrying ``data`` (validated into ``T``)."""
        return cls(success=True, data=data)


class ErrorAnswer(BaseModel):
    """Every error: ``success: false``, ``data: null`` (the reference's envelope) and what to fix."""

    success: Literal[False] = False
    data: None = None
    error: ErrorDetail


class EnvListing(BaseModel):
    """One served environment in ``GET /envs``."""

    env_type: str
    splits: list[str]
    has_tools: bool
    isolation: Isolation


class ServiceStats(BaseModel):
    """``GET /stats`` data: live instances and the instance manager's counters (new counters pass through)."""

    model_config = ConfigDict(extra="allow")

    live_instances: int
    max_instances: int
    created: int
    released: int
    reaped: int
    failed: int


class EnvsAnswer(Answer[list[EnvListing]]):
    """``GET /envs``: what is served."""


class ToolsAnswer(Answer[list[dict[str, Any]] | None]):
    """``GET /envs/{env_type}/tools``: tool schemas in OpenAI function format; null for a free-text environment."""


class CapabilitiesAnswer(Answer[EnvCapabilities]):
    """``GET /envs/{env_type}/capabilities``: the optional behaviours the environment offers."""


class StepLabelsAnswer(Answer[StepLabelsData]):
    """``POST /step_labels``: GOOD/BAD per step of a finished episode."""


class TaskWritingAnswer(Answer[TaskWritingData]):
    """``POST /task_writing``: the tasks an exploration's tool calls determine."""


class ProfileAnswer(Answer[list[str]]):
    """``POST /get_env_profile``: the task ids of a split."""


class CreateAnswer(Answer[CreateData]):
    """``POST /create``: the opening messages and the instance identity."""


class StepAnswer(Answer[StepData]):
    """``POST /step``: the observation, the step's reward, whether the episode ended, extras."""


class EvaluateAnswer(Answer[float]):
    """``POST /evaluate``: the instance's score."""


class InfoAnswer(Answer[dict[str, Any]]):
    """``POST /get_info``: what the environment says about the instance (its own keys)."""


class StatsAnswer(Answer[ServiceStats]):
    """``GET /stats``: the instance manager's counters."""


class ReleaseAnswer(BaseModel):
    """``POST /release``: ``{success: true, data: true}``; releasing nothing answers 200 ``{success: false,
    data: null, error}`` as the reference does (its clients read ``success`` and would retry a 4xx)."""

    success: bool
    data: bool | None
    error: ErrorDetail | None = None
