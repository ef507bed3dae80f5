"""Tasks written by the environment from an exploration: the optional ``task_writing`` capability of the
environment service.

Where an exploration's observations determine a task completely (calc: the calculator was called with
``17 * 23`` and returned ``391``), the environment itself renders each successful tool call as a question in
the style of its own tasks ("What is 17 * 23?"), the observed result as the answer and the observation as the
evidence, with no LLM (``task_manager.writer: env``, :mod:`agentevolver.module.task_manager.env_writer`).
How a call reads as a question is knowledge of the environment, so it lives with the environment
(calc: :mod:`env_service.environments.calc.task_writing`); the task manager only asks, and still proves every
rendered task before keeping it. The route is ``POST /task_writing`` with the usual envelope; an environment
advertises the capability at ``GET /envs/{env_type}/capabilities``. Client and service both use the models
below, so they cannot drift. Wire format and errors: docs/env_service.md.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RENDER_COUNTS", "TASK_WRITING", "ObservedCall", "RenderedTask", "Rendering", "TaskWritingData",
           "TaskWritingRequest"]

#: The capability name an environment lists when it implements ``write_tasks``.
TASK_WRITING: Final = "task_writing"

#: What a rendering counts, in the order a report shows them: every tool call seen; those that failed (an
#: error result, or for a number answer not exactly one number); those the environment cannot render (a tool
#: it has no question for, an argument missing); the same call again in one exploration (one task, not two);
#: a call restating the seed task's own question; those beyond the limit; the tasks rendered.
RENDER_COUNTS: Final = ("calls_seen", "calls_failed", "calls_not_rendered", "calls_merged", "seed_copies",
                        "over_limit", "tasks_rendered")


class ObservedCall(BaseModel):
    """One successful-or-not tool call of an exploration, as the task manager's proof check reads it
    (:class:`agentevolver.module.task_manager.proof.Observation`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1)
    arguments: Any = None  # parsed from JSON when the call gave a string
    text: str  # the tool's result
    call: str = Field(min_length=1)  # "name(arguments)" for people to read


class TaskWritingRequest(BaseModel):
    """``/task_writing``: render the tool calls of one exploration (in order) as tasks.

    ``seed_query`` is the question of the explored seed task (a rendering that restates it is dropped);
    ``limit`` caps the tasks (``task_manager.tasks_per_exploration``; null for no cap). ``all_renderings``:
    every question a call can be written as, not one per call (``task_manager.writer_all_renderings``).
    """

    model_config = ConfigDict(extra="forbid")

    env_type: str = Field(min_length=1)
    calls: list[ObservedCall]
    seed_query: str | None = None
    limit: int | None = Field(default=None, ge=0)
    all_renderings: bool = False


class RenderedTask(BaseModel):
    """One task the environment wrote: the fields the proof check reads (as an LLM writer's item has them)."""

    model_config = ConfigDict(frozen=True)

    query: str
    answer: str
    evidence: str
    call: str
    #: the environment's difficulty level the task is written at (calc: single, chain, word, distractor,
    #: convert), recorded with the task so a run's report shows its level mix; None when it has no levels
    level: str | None = None


class Rendering(BaseModel):
    """The tasks rendered from one exploration and what the rendering skipped (keys of :data:`RENDER_COUNTS`)."""

    tasks: list[RenderedTask] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_counts(self) -> Rendering:
        unknown = sorted(set(self.counts) - set(RENDER_COUNTS))
        if unknown:
            raise ValueError(f"counts {unknown} are not rendering counts ({', '.join(RENDER_COUNTS)})")
        return self


class TaskWritingData(Rendering):
    """``/task_writing`` data: the rendering of one exploration, for ``env_type``."""

    env_type: str
