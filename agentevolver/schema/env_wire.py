"""Request and response bodies of the environment service (wire-compatible with the reference).

Every route takes the same envelope ``{env_type, task_id, instance_id, messages, params}`` and answers
``{success, data}``. The route-specific request models below only tighten which fields are required, so
a client built on them sends exactly what the reference service accepts, and the service (which uses the
same models) rejects a missing field with a 4xx naming it. ``error`` is an addition: on failure it says
what went wrong and which field to fix, instead of an opaque ``success: false``.

The reference's clients send ``null`` for every envelope field a route does not use (``"task_id": null``
on ``/step``, ``"instance_id": null`` on ``/create``), so ``null`` reads as "not given" everywhere; a
route that needs the field still answers 422 naming it.

How answers are shaped is chosen per request by ``params.shape`` (:data:`SHAPE_PARAM`): ``reference``
(the default, what an unchanged reference client and trainer read) or ``native`` (this framework's richer
form, which :class:`~agentevolver.client.env_client.EnvClient` asks for). See docs/env_service.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentevolver.schema.error import ErrorDetail
from agentevolver.schema.message import ChatMessage

T = TypeVar("T")

#: The request parameter that picks the answer shape of ``/create`` and ``/step``.
SHAPE_PARAM: Final = "shape"
#: ``reference``: ``/create`` opens with exactly [system, user] (tools listed in the system message) and
#: every ``/step`` observes exactly one ``user`` message. ``native``: the environment's own messages --
#: all opening messages (demonstrations as real turns), one ``tool`` message per tool call, and no message
#: after the final step.
Shape = Literal["reference", "native"]
SHAPES: Final[tuple[str, ...]] = ("reference", "native")
DEFAULT_SHAPE: Final[Shape] = "reference"


def _or_null(schema: dict[str, Any]) -> None:
    """The OpenAPI schema of a field that also takes ``null`` (read as "not given", see the validators)."""
    kept = {key: schema.pop(key) for key in ("title", "default", "description") if key in schema}
    own = dict(schema)
    schema.clear()
    schema.update(anyOf=[own, {"type": "null"}], **kept)


#: Declares ``null`` in the schema only; validation is unchanged (the before-validators turn it into "" / {}).
_NULLABLE = Field(json_schema_extra=_or_null)
_NullableId = Annotated[str, _NULLABLE]


class EnvRequest(BaseModel):
    """The common request envelope. Unknown keys are rejected so typos surface as 4xx, not as defaults."""

    model_config = ConfigDict(extra="forbid")

    env_type: _NullableId = ""
    task_id: _NullableId = ""
    instance_id: _NullableId = ""
    messages: Annotated[dict[str, Any] | list[dict[str, Any]], _NULLABLE] = Field(default_factory=dict)
    params: Annotated[dict[str, Any], _NULLABLE] = Field(default_factory=dict)

    @field_validator("env_type", "task_id", "instance_id", mode="before")
    @classmethod
    def _null_id_is_absent(cls, value: Any) -> Any:
        """The reference clients send ``null`` for ids a route does not use; treat it as not given."""
        return "" if value is None else value

    @field_validator("messages", "params", mode="before")
    @classmethod
    def _null_body_is_empty(cls, value: Any) -> Any:
        """``null`` messages/params mean "none", as an omitted field does."""
        return {} if value is None else value


class ProfileRequest(EnvRequest):
    """``/get_env_profile``: the task ids of ``params.split`` (e.g. train, val) of one environment."""

    env_type: str = Field(min_length=1)


class CreateRequest(EnvRequest):
    """``/create``: start an instance of ``env_type`` on ``task_id``; ``instance_id`` may be client-chosen."""

    env_type: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class StepRequest(EnvRequest):
    """``/step``: apply the assistant message in ``messages`` (role, content, tool_calls) to the instance."""

    instance_id: str = Field(min_length=1)
    messages: dict[str, Any]


class EvaluateRequest(EnvRequest):
    """``/evaluate``: score the instance; ``params.sparse`` = 1/0 all-or-nothing instead of passes/total."""

    instance_id: str = Field(min_length=1)


class InstanceRequest(EnvRequest):
    """``/get_info`` and ``/release``: address one live instance."""

    instance_id: str = Field(min_length=1)


class EnvResponse(BaseModel, Generic[T]):
    """Either outcome of any route, for a reader that does not know which it got (``success`` says).

    The service declares and sends one model per route (:mod:`agentevolver.schema.env_answers`).
    """

    success: bool
    data: T | None = None
    error: ErrorDetail | None = None


class InstanceInfo(BaseModel):
    """Identity of an instance, returned by ``/create`` (extra keys are environment-specific)."""

    model_config = ConfigDict(extra="allow")

    instance_id: str
    task_id: str
    env_type: str = Field(default="", description="Always sent by this service; absent in the reference's answers.")


class CreateData(BaseModel):
    """``/create`` data: the opening messages and the instance identity."""

    state: list[ChatMessage] = Field(
        description="reference shape: exactly [system, user]; native: the environment's opening messages")
    info: InstanceInfo


class StepData(BaseModel):
    """``/step`` data: the observation messages, the step reward, whether the episode ended, extras.

    The service always sends every field. ``info`` may carry ``fallback: true`` when the client synthesised
    this observation after the service kept failing, so the trainer can count such steps.
    """

    state: list[ChatMessage] = Field(
        description="reference shape: exactly one user message; native: one message per tool result")
    reward: float = 0.0
    is_terminated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)
