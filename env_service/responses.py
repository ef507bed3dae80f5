"""The declared answers of every route: what ``/docs`` shows and what the schema fuzzer checks answers against.

Declared, not enforced: the routes build their answers as before (``{success, data}`` exactly as the
reference's clients read them; no ``error: null`` added to a success), and these models only describe
them in the OpenAPI document (``responses=`` of each route). ``tests/test_fuzz_env_service.py`` drives the
app with generated requests and checks every answer against these declarations, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from agentevolver.schema import ChatMessage, ErrorDetail
from agentevolver.schema.step_labels import EnvCapabilities, StepLabelsData
from agentevolver.schema.task_writing import TaskWritingData
from env_service.base import Isolation

__all__ = [
    "CREATE_ERRORS",
    "ENV_ERRORS",
    "INSTANCE_ERRORS",
    "ok",
]


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


class CreatedInstance(BaseModel):
    """``/create`` ``data.info``: who the instance is."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    task_id: str
    env_type: str


class CreateAnswer(BaseModel):
    """``/create`` data: the opening messages and the instance identity."""

    state: list[ChatMessage] = Field(
        description="reference shape: exactly [system, user]; native: the environment's opening messages")
    info: CreatedInstance


class StepAnswer(BaseModel):
    """``/step`` data: the observation, the step's reward, whether the episode ended, extras."""

    state: list[ChatMessage] = Field(
        description="reference shape: exactly one user message; native: one message per tool result")
    reward: float
    is_terminated: bool
    info: dict[str, Any] = Field(default_factory=dict)


class Stats(BaseModel):
    """``GET /stats`` data: live instances and the manager's counters."""

    model_config = ConfigDict(extra="allow")

    live_instances: int
    max_instances: int
    created: int
    released: int
    reaped: int
    failed: int


def ok(data: Any, name: str) -> type[BaseModel]:
    """The success envelope ``{success: true, data: <data>}`` as a named model (one OpenAPI component each)."""
    return create_model(name, __doc__=f"Success answer: ``data`` is {getattr(data, '__name__', data)}.",
                        success=(Literal[True], True), data=(data, ...))


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorAnswer} for status in statuses}


#: Every route guarded by the token may answer these (400 not JSON, 401 token, 413 body, 422 a field).
COMMON_ERRORS = _errors(400, 401, 413, 422)
#: Routes that name an environment (404 unknown_env / unknown_split / unknown_task, 503 env_unavailable).
ENV_ERRORS = {**COMMON_ERRORS, **_errors(404, 503)}
#: Routes that address a live instance (404 unknown, 410 gone, 502 crashed, 504 timed out).
INSTANCE_ERRORS = {**COMMON_ERRORS, **_errors(404, 410, 502, 504)}
#: ``/create``: an environment and a new instance (409 duplicate id, 429 service full).
CREATE_ERRORS = {**ENV_ERRORS, **INSTANCE_ERRORS, **_errors(409, 429)}

EnvsAnswer = ok(list[EnvListing], "EnvsAnswer")
ToolsAnswer = ok(list[dict[str, Any]] | None, "ToolsAnswer")
CapabilitiesAnswer = ok(EnvCapabilities, "CapabilitiesAnswer")
StepLabelsAnswer = ok(StepLabelsData, "StepLabelsAnswer")
TaskWritingAnswer = ok(TaskWritingData, "TaskWritingAnswer")
ProfileAnswer = ok(list[str], "ProfileAnswer")
CreateAnswerEnvelope = ok(CreateAnswer, "CreateAnswerEnvelope")
StepAnswerEnvelope = ok(StepAnswer, "StepAnswerEnvelope")
EvaluateAnswer = ok(float, "EvaluateAnswer")
InfoAnswer = ok(dict[str, Any], "InfoAnswer")
StatsAnswer = ok(Stats, "StatsAnswer")


class ReleaseAnswer(BaseModel):
    """``/release``: ``data: true``; releasing nothing answers 200 ``success: false`` as the reference does."""

    success: bool
    data: bool | None
    error: ErrorDetail | None = None
