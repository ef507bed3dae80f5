"""Tasks: what an episode is asked to do, and the objectives Self-Questioning writes.

A :class:`Task` is what an episode is asked to do and how it is graded (original tasks from an environment
split, and synthetic ones the task manager wrote). A :class:`TaskObjective` wraps a task with what the task
manager knows about it (where it came from, how confident the summariser was). One object travels from the
task manager to the grader: the trainer's dataset rows hold the objective itself, the agent loop wraps it in
an episode (``EpisodeSpec.task``) and the grader reads that task; nothing serialises or rebuilds it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Task(BaseModel):
    """A task in an environment.

    ``query`` is None for original tasks whose instruction the environment supplies at ``/create``; a
    synthetic task always carries its own query. ``evaluator`` names the grader (registry name) that
    scores an episode of this task; ``env`` means the environment's own ``/evaluate``.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(min_length=1)
    env_type: str = Field(min_length=1)
    query: str | None = None
    open_query: bool = False
    ground_truth: str | None = None
    evaluator: str = Field(default="env", min_length=1)
    metadata: dict[str, Any] = Field(default_factory=dict)


class TaskObjective(BaseModel):
    """A task written by Self-Questioning, with its provenance and the summariser's confidence."""

    model_config = ConfigDict(extra="forbid")

    task: Task
    source: Literal["original", "synthetic"] = "synthetic"
    seed_task_id: str | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    reward: float | None = None

    @property
    def instance_task_id(self) -> str:
        """The environment task an episode's instance is created from: the task itself for an original task,
        its seed for a synthetic one (the environment knows no synthetic ids; the synthetic ``query``
        replaces the seed's task message)."""
        if self.source == "synthetic" and self.seed_task_id:
            return self.seed_task_id
        return self.task.task_id
