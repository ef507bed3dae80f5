"""The synthetic-task file (JSON lines, one :class:`TaskObjective` per line) and task rows.

Generation writes the file; the training mixture reads it. A task row is what the trainer's dataset and
the agent loop carry (:class:`~agentevolver.module.agent_flow.episode.EpisodeSpec` fields). For a
synthetic task the row's ``task_id`` is its *seed* task (the instance is created from it: the environment
knows no synthetic ids), ``query`` replaces the environment's task message, and ``metadata`` carries what
grading needs: ``evaluator`` (the grader's registry name), ``ground_truth``, ``synthetic_task_id``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.checkpoint import atomic_write_text
from agentevolver.schema import Task, TaskObjective

__all__ = ["objective_to_row", "original_objectives", "read_objectives", "task_from_row", "write_objectives"]


def write_objectives(path: str | Path, objectives: Iterable[TaskObjective]) -> Path:
    """Write the file atomically; returns its path."""
    target = Path(path)
    lines = [json.dumps(o.model_dump(mode="json"), ensure_ascii=False) for o in objectives]
    atomic_write_text(target, "".join(line + "\n" for line in lines))
    return target


def read_objectives(path: str | Path, key: str = "task_manager.synthetic_tasks_path") -> list[TaskObjective]:
    """Read the file; :class:`ConfigError` naming the key (missing file) or the line (bad record)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{key}: {str(file)!r} does not exist; generate tasks first (python -m "
                          "agentevolver.module.task_manager, or task_manager.n > 0) or point the key at a file")
    objectives = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            objectives.append(TaskObjective.model_validate_json(line))
        except ValidationError as err:
            raise ConfigError(f"{key}: {file}:{number} is not a task objective: {err.errors()[0]['msg']} "
                              f"at {'.'.join(map(str, err.errors()[0]['loc']))}") from err
    return objectives


def original_objectives(task_ids: Sequence[str], env_type: str, grader: str) -> list[TaskObjective]:
    """The environment's own tasks as objectives (source "original", graded by ``grader``)."""
    return [TaskObjective(task=Task(task_id=t, env_type=env_type, evaluator=grader), source="original")
            for t in task_ids]


def objective_to_row(objective: TaskObjective, create_params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The task row of an objective (see the module docstring)."""
    task = objective.task
    row: dict[str, Any] = {"env_type": task.env_type, "env_params": dict(create_params or {})}
    if objective.source == "original":
        row["task_id"] = task.task_id
        if task.query is not None:
            row["query"] = task.query
        if task.evaluator != "env":
            row["metadata"] = {"source": "original", "evaluator": task.evaluator}
        return row
    row["task_id"] = objective.seed_task_id or task.task_id
    row["query"] = task.query
    row["metadata"] = {"source": "synthetic", "evaluator": task.evaluator, "synthetic_task_id": task.task_id,
                       "ground_truth": task.ground_truth}
    return row


def task_from_row(row: Mapping[str, Any]) -> Task:
    """The task a row asks for, as graders see it (a synthetic row's id is its synthetic id)."""
    metadata = dict(row.get("metadata") or {})
    return Task(task_id=str(metadata.get("synthetic_task_id") or row["task_id"]), env_type=str(row["env_type"]),
                query=row.get("query"), ground_truth=metadata.get("ground_truth"),
                evaluator=str(metadata.get("evaluator", "env")))
