"""Seed tasks: what exploration starts from: training tasks, or the environment's exploration seeds (split
``explore``: one per tool, not tasks) when no human task is given; never validation tasks, so no synthetic task
is derived from an evaluation task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.errors import ConfigError
from agentevolver.schema import Task

__all__ = ["seed_split", "seed_tasks", "spread_over"]

T = TypeVar("T")


def spread_over(items: Sequence[T], limit: int) -> list[T]:
    """``limit`` items spread evenly over ``items`` (all of them when ``limit`` < 0 or >= their number).

    Environments list tasks grouped by level or kind, so the first N would be one level only.
    """
    if limit < 0 or limit >= len(items):
        return list(items)
    return [items[index * len(items) // limit] for index in range(limit)]


def seed_split(settings: AgentEvolverSettings) -> str:
    """The split seeds come from: ``task_manager.seed_split``, or ``env_service.train_split`` when it is null."""
    return settings.task_manager.seed_split or settings.env_service.train_split


def seed_tasks(env: Any, settings: AgentEvolverSettings) -> list[Task]:
    """``task_manager.num_seed_tasks`` tasks spread over :func:`seed_split` (an EnvClient lists them)."""
    section = settings.env_service
    split = seed_split(settings)
    key = "task_manager.seed_split" if settings.task_manager.seed_split else "env_service.train_split"
    if split == section.val_split:
        raise ConfigError(f"{key} is the validation split {split!r}: synthetic tasks would be written from "
                          "evaluation tasks; use the training split or the exploration seeds (seed_split: explore)")
    try:
        task_ids = env.get_env_profile(section.env_type, split)
    except Exception as err:  # the client's error names the service problem; add what we were doing
        raise ConfigError(f"cannot list the {split!r} tasks of environment {section.env_type!r} at {section.env_url} "
                          f"({key}: seed tasks of task generation): {err}") from err
    if not task_ids:
        raise ConfigError(f"environment {section.env_type!r} lists no task in split {split!r} ({key}); name a "
                          "split that has tasks, or 'explore' for its exploration seeds")
    chosen = spread_over(task_ids, settings.task_manager.num_seed_tasks)
    return [Task(task_id=task_id, env_type=section.env_type) for task_id in chosen]
