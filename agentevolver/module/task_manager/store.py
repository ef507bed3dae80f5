"""The synthetic-task file (JSON lines, one :class:`TaskObjective` per line) and the original tasks as objectives.

Generation writes the file; the training mixture reads it. The trainer's dataset rows hold the objectives
themselves (:class:`~agentevolver.verl.task_dataset.TaskDataset`); the agent loop turns each into an episode
with :meth:`~agentevolver.module.agent_flow.episode.EpisodeSpec.for_objective`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import ValidationError

from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.checkpoint import atomic_write_text
from agentevolver.schema import Task, TaskObjective

__all__ = ["original_objectives", "read_objectives", "write_objectives"]


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
