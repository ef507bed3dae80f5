"""codebox's exploration seeds (split ``explore``): ``explore-run_python`` and ``explore-submit``.

A seed opens like a task (the protocol, then a question) but asks the agent to find out what a tool does; it
has no hidden tests, so a submission is not graded and ``/evaluate`` scores 0. Self-Questioning explores the
seeds when no human task is given (:mod:`env_service.environments.exploration_seeds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from env_service.environments.codebox import prompts
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, tool_seeds

__all__ = ["SeedTask", "seed_task", "seed_task_ids"]

#: What a submission in a seed episode gets back (and the episode ends, as after any submission).
NOT_GRADED = "Nothing to grade: this is an exploration seed, not a task. The episode has ended."


@dataclass(frozen=True)
class SeedTask:
    """The fields of a :class:`~.tasks.CodeTask` an episode reads, for a seed."""

    task_id: str
    query: str
    split: str = EXPLORE_SPLIT
    difficulty: str = "seed"
    entry_point: str = ""

    @property
    def title(self) -> str:
        return self.task_id

    def statement(self) -> str:
        return self.query


def _seeds() -> dict[str, str]:
    return tool_seeds([dict(schema) for schema in prompts.TOOL_SCHEMAS])


def seed_task_ids() -> list[str]:
    """The seed ids, one per tool."""
    return list(_seeds())


def seed_task(task_id: str) -> SeedTask | None:
    """The seed ``task_id`` names, or None."""
    query = _seeds().get(task_id)
    return SeedTask(task_id=task_id, query=query) if query is not None else None
