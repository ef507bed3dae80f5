"""Tasks as a dataset verl's dataloader can batch: one row per task, the agent loop reads ``task``.

verl's ``RLHFDataset`` holds chat prompts; an agent-environment run holds *tasks* whose prompt the
environment writes at ``/create``. A row here carries the task as a JSON string (so verl's collate keeps
it as one object), ``agent_name`` (our agent loop), ``data_source`` (the env type: verl groups validation
metrics by it), ``raw_prompt`` (a one-message stand-in; verl copies it into the outputs) and verl's
``dummy_tensor`` (a batch must hold at least one tensor). The order of rows is the order of ``tasks``;
verl's sampler shuffles, and its stateful dataloader checkpoints the position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeSpec
from agentevolver.module.agent_flow.verl_loop import AGENT_LOOP_NAME

__all__ = ["TaskDataset", "spread_over", "task_rows", "tasks_from_env_service"]


def spread_over(items: Sequence[Any], limit: int) -> list[Any]:
    """``limit`` items spread evenly over ``items`` (all of them when ``limit`` < 0 or >= their number).

    Environments list tasks grouped by level or kind, so the first N would be one level only.
    """
    if limit < 0 or limit >= len(items):
        return list(items)
    return [items[index * len(items) // limit] for index in range(limit)]


class TaskDataset(Dataset):
    """Rows for verl's agent-loop rollout, one per task (see the module docstring)."""

    def __init__(self, tasks: Sequence[Mapping[str, Any]], *, name: str = "tasks") -> None:
        if not tasks:
            raise ConfigError(f"the {name} dataset is empty: the environment split has no tasks (check "
                              "env_service.env_type and the split names env_service.train_split / val_split)")
        self.tasks = [dict(task) for task in tasks]
        for task in self.tasks:  # validate every row now: a bad task fails at load, not mid-run
            EpisodeSpec.model_validate({"group_id": "check", **task})

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, index: int) -> dict[str, Any]:
        task = self.tasks[index]
        return {
            "task": json.dumps(task, sort_keys=True),
            "agent_name": AGENT_LOOP_NAME,
            "data_source": task["env_type"],
            "raw_prompt": [{"role": "user", "content": f"task {task['task_id']}"}],
            "index": index,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }


def tasks_from_env_service(
    env_client: Any, env_type: str, split: str, limit: int = -1, create_params: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Task rows of an environment split; each carries the ``create_params`` sent with its /create.

    ``limit`` < 0 takes every task; otherwise ``limit`` tasks spread evenly over the split, not its first
    ones: environments list their tasks grouped by level or kind, and the first N would be one level only
    (calc's first 16 validation tasks are all one-operation questions).
    """
    try:
        task_ids = env_client.get_env_profile(env_type, split)
    except Exception as err:  # the client's error names the service problem; add what we were doing
        raise ConfigError(f"cannot list the {split!r} tasks of environment {env_type!r} at "
                          f"{env_client.settings.env_url}: {err}") from err
    return task_rows(spread_over(task_ids, -1 if limit is None else limit), env_type, create_params)


def task_rows(
    task_ids: Sequence[str], env_type: str, create_params: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One task row (:class:`EpisodeSpec` fields) per id, each carrying the ``create_params`` of its /create."""
    params = dict(create_params or {})
    return [{"task_id": task_id, "env_type": env_type, "env_params": params} for task_id in task_ids]
