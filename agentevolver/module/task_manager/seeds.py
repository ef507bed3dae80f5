"""Seed tasks: the training tasks exploration starts from (never validation tasks, so no synthetic task
is derived from an evaluation task)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.errors import ConfigError
from agentevolver.schema import Task

__all__ = ["seed_tasks", "spread_over"]

T = TypeVar("T")


def spread_over(items: Sequence[T], limit: int) -> list[T]:
    """``limit`` items spread evenly over ``items`` (all of them when ``limit`` < 0 or >= their number).

    Environments list tasks grouped by level or kind, so the first N would be one level only.
    """
    if limit < 0 or limit >= len(items):
        return list(items)
    return [items[index * len(items) // limit] for index in range(limit)]


def seed_tasks(env: Any, settings: AgentEvolverSettings) -> list[Task]:
    """``task_manager.num_seed_tasks`` tasks spread over ``env_service.train_split`` (an EnvClient lists them)."""
    section = settings.env_service
    try:
        task_ids = env.get_env_profile(section.env_type, section.train_split)
    except Exception as err:  # the client's error names the service problem; add what we were doing
        raise ConfigError(f"cannot list the {section.train_split!r} tasks of environment {section.env_type!r} "
                          f"at {section.env_url} (seed tasks of task generation): {err}") from err
    chosen = spread_over(task_ids, settings.task_manager.num_seed_tasks)
    return [Task(task_id=task_id, env_type=section.env_type) for task_id in chosen]
