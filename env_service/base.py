"""The contract every environment implements: one instance of an environment working on one task.

An environment is a package under ``env_service/environments/<name>/`` whose ``__init__`` defines a
:class:`BaseEnv` subclass decorated with :func:`env_service.registry.register_env`. The service never
imports environment code it was not asked to serve, and adding an environment needs no change here.

Instances may run in the service process (``inline``), in a process of their own (``process``) or in a
Ray actor (``ray``); the class only says which it prefers (:attr:`BaseEnv.isolation`). Because of that,
everything an instance returns must be plain data (pydantic models / dicts), and ``__init__`` must not
hold on to service state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from agentevolver.schema import ChatMessage
from agentevolver.schema.env_answers import Isolation  # one definition, shared with the /envs answer
from agentevolver.schema.step_labels import STEP_LABELS, StepLabel
from agentevolver.schema.task_writing import TASK_WRITING, ObservedCall, Rendering
from env_service.errors import EnvServiceError, UnknownSplit


class CapabilityUnsupported(EnvServiceError):
    """The environment does not offer an optional capability (e.g. ``step_labels``) the request asks for.

    A 4xx, not a 5xx: asking again cannot help, and the client must not retry it.
    """

    status = 400
    code = "capability_unsupported"


class CannotLabel(EnvServiceError):
    """The environment offers step labels but not for this episode (its messages do not hold the task's
    question, e.g. a synthetic task run on this task id, or its steps cannot be read)."""

    status = 422
    code = "cannot_label"


class StepOutcome(BaseModel):
    """What one ``/step`` returns: observation messages, step reward, whether the episode ended, extras."""

    state: list[ChatMessage]
    reward: float = 0.0
    is_terminated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class BaseEnv(ABC):
    """One live instance of an environment on one task.

    Class-level API (no instance needed): :meth:`splits`, :meth:`task_ids`, :meth:`tool_schemas`.
    Instance API, called in this order by the service: ``__init__`` (validate the task, set up state),
    :meth:`reset` once, then any number of :meth:`step`, :meth:`evaluate` and :meth:`info`, and finally
    :meth:`close` exactly once (also after a failed call, so it must tolerate half-built state).
    """

    #: Registry name (set by ``register_env``).
    name: ClassVar[str] = ""
    #: Preferred isolation of instances; the service may be told otherwise per environment.
    isolation: ClassVar[Isolation] = "inline"

    # ------------------------------------------------------------------ class-level
    @classmethod
    @abstractmethod
    def splits(cls) -> list[str]:
        """Names of the task splits this environment ships (e.g. ``["train", "val", "test"]``)."""

    @classmethod
    @abstractmethod
    def task_ids(cls, split: str) -> list[str]:
        """Task ids of ``split``; raise :class:`UnknownSplit` (use :meth:`check_split`) for a bad name."""

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]] | None:
        """The tools an agent may call, in OpenAI function format; None for environments without tools."""
        return None

    @classmethod
    def capabilities(cls) -> list[str]:
        """Optional behaviours beyond the contract, by name (served at ``GET /envs/{env_type}/capabilities``).

        Derived from what the class implements, so a capability can never be advertised without its code:
        ``step_labels`` when it overrides :meth:`label_steps`, ``task_writing`` when it overrides
        :meth:`write_tasks`.
        """
        implemented = ((STEP_LABELS, "label_steps"), (TASK_WRITING, "write_tasks"))
        return [name for name, method in implemented
                if getattr(cls, method).__func__ is not getattr(BaseEnv, method).__func__]

    @classmethod
    def label_steps(cls, task_id: str, messages: list[ChatMessage], params: dict[str, Any]) -> list[StepLabel]:
        """Optional (capability ``step_labels``): GOOD/BAD for every agent step of a finished episode.

        Class-level because the episode's instance is gone by the time a trainer asks: the labels come from
        the task and the recorded ``messages`` alone (steps as :func:`agentevolver.schema.step_labels.split_steps`
        numbers them, labels for steps 0..K-1 in order). Raise :class:`CannotLabel` for an episode that cannot
        be labelled, :class:`~env_service.errors.UnknownTask` for an unknown ``task_id``.
        """
        raise CapabilityUnsupported(
            f"environment {cls.name!r} does not offer the {STEP_LABELS!r} capability (it cannot label the "
            f"steps of an episode); use an LLM judge for it "
            f"(attribution_driven_credit_assignment.judge.source: llm)", field="env_type")

    @classmethod
    def write_tasks(cls, calls: list[ObservedCall], seed_query: str | None, limit: int | None,
                    all_renderings: bool = False) -> Rendering:
        """Optional (capability ``task_writing``): the tasks an exploration's tool ``calls`` determine, with no LLM.

        Class-level and pure, like :meth:`label_steps`: each successful call the environment can phrase becomes a
        question in the style of its own tasks, its observed result the answer, the call the evidence; a rendering
        of ``seed_query`` is dropped and at most ``limit`` tasks are kept, and what was skipped is counted
        (:data:`agentevolver.schema.task_writing.RENDER_COUNTS`). The caller proves every task before keeping it.
        ``all_renderings`` asks for every question a call can be written as (an environment with one question a
        call may ignore it).
        """
        raise CapabilityUnsupported(
            f"environment {cls.name!r} does not offer the {TASK_WRITING!r} capability (it cannot write tasks from "
            "an exploration); use an LLM task writer for it (task_manager.writer: llm)", field="env_type")

    @classmethod
    def check_split(cls, split: str) -> None:
        """Raise :class:`UnknownSplit` naming ``params.split`` and the valid splits."""
        if split not in cls.splits():
            raise UnknownSplit(
                f"environment {cls.name!r} has no split {split!r}; splits: {', '.join(cls.splits())}",
                field="params.split",
            )

    # ------------------------------------------------------------------ instance-level
    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        """Validate ``task_id`` (raise :class:`UnknownTask`) and set up the instance; no I/O to the caller."""
        self.task_id = task_id
        self.instance_id = instance_id
        self.params = params

    @abstractmethod
    def reset(self) -> list[ChatMessage]:
        """The opening messages of the episode (typically a system message and the user's task)."""

    @abstractmethod
    def step(self, action: ChatMessage) -> StepOutcome:
        """Apply the assistant's message (content and/or tool_calls); raise :class:`BadAction` if invalid."""

    @abstractmethod
    def evaluate(self, sparse: bool) -> float:
        """Score the episode so far: sparse = 1.0 if all checks pass else 0.0; dense = passed / total."""

    def info(self) -> dict[str, Any]:
        """Environment/tool information about this instance (extended by subclasses)."""
        tools = self.tool_schemas()
        return {"env_type": self.name, "task_id": self.task_id, "instance_id": self.instance_id,
                **({"tools": tools} if tools is not None else {})}

    def close(self) -> None:  # noqa: B027 - optional hook, most environments hold nothing to free
        """Free everything the instance holds (processes, files). Called exactly once."""
