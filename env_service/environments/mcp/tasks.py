"""The tasks of the ``mcp`` environment: a user's JSONL file, or exploration seeds when there is none.

A task file has one JSON object a line::

    {"id": "utc-day", "query": "What day of the week is it in UTC?", "answer": "Tuesday",
     "checker": {"type": "contains"}, "split": "train", "servers": ["time"]}

Only ``query`` is required. ``id`` defaults to ``<split>-<line number>``; ``split`` to ``train``;
``servers`` (a subset of the configured ones) to all. ``answer`` is the reference answer: with it and no
``checker``, the agent's final answer must contain it (case and spacing aside). A ``checker`` says how the
episode is scored by ``/evaluate``:

* ``{"type": "contains" | "exact" | "regex", "value": ...}`` on the final answer (``value`` defaults to
  ``answer``);
* ``{"type": "number", "value": ..., "rel_tol": 1e-6}``: the final answer's number equals it;
* ``{"type": "tool", "tool": "git_log", "arguments": {...}, "expect": "text"}``: after the episode the tool is
  called on the episode's own servers, and its result must contain ``expect`` (stateful checks: "was the
  commit made").

Without a file the environment has no task of its own: it offers one **exploration seed** per tool
(``explore-<tool>``, in ``train`` and ``val``; :mod:`env_service.environments.exploration_seeds`), so
Self-Questioning can explore each tool and write tasks, which its grader scores. A seed has no answer and ``/evaluate`` gives it 0.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from env_service.environments.exploration_seeds import seed_id, seed_query
from env_service.errors import EnvUnavailable

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


class Checker(BaseModel):
    """How ``/evaluate`` scores an episode of the task (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["contains", "exact", "regex", "number", "tool"]
    value: Any = None
    rel_tol: float = Field(default=1e-6, ge=0)
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    expect: str | None = None

    @model_validator(mode="after")
    def _complete(self) -> Checker:
        if self.type == "tool" and (not self.tool or self.expect is None):
            raise ValueError("a tool checker needs tool (the tool to call) and expect (text its result must contain)")
        return self


class McpTask(BaseModel):
    """One task."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    query: str = Field(min_length=1)
    answer: str | None = None
    checker: Checker | None = None
    split: str = Field(default="train", min_length=1)
    servers: list[str] | None = None

    @model_validator(mode="after")
    def _checkable(self) -> McpTask:
        needs_value = self.checker is not None and self.checker.type != "tool" and self.checker.value is None
        if needs_value and self.answer is None:
            raise ValueError(f"checker {self.checker.type!r} needs value or the task's answer")  # type: ignore[union-attr]
        return self

    @property
    def seed(self) -> bool:
        return self.id.startswith("explore-") and self.answer is None and self.checker is None


def load_task_file(path: Path) -> list[McpTask]:
    """Every task of a JSONL file; an error names the file, the line and the field."""
    where = f"MCP task file {str(path)!r} (tasks in the MCP config)"
    if not path.is_file():
        raise EnvUnavailable(f"{where} does not exist; fix the path (relative to the config file) or drop "
                             "tasks to explore without tasks", field="env_type")
    tasks: list[McpTask] = []
    seen: set[str] = set()
    counters: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as err:
            raise EnvUnavailable(f"{where} line {number} is not JSON: {err}", field="env_type") from err
        if isinstance(raw, dict) and "id" not in raw:
            split = str(raw.get("split", "train"))
            counters[split] = counters.get(split, 0) + 1
            raw = {**raw, "id": f"{split}-{counters[split]:04d}"}
        try:
            task = McpTask.model_validate(raw)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'line'}: "
                                 f"{e['msg'].removeprefix('Value error, ')}" for e in err.errors(include_url=False))
            raise EnvUnavailable(f"{where} line {number}: {problems}", field="env_type") from err
        if task.id in seen:
            raise EnvUnavailable(f"{where} line {number}: id {task.id!r} is used twice", field="env_type")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise EnvUnavailable(f"{where} holds no task", field="env_type")
    return tasks


def exploration_seeds(tools: list[tuple[str, str, str]]) -> list[McpTask]:
    """One seed per (exposed name, server, description), in ``train`` and ``val``; see the module docstring."""
    seeds = []
    for split in ("train", "val"):
        for name, server, description in tools:
            seeds.append(McpTask(id=seed_id(name) if split == "train" else f"{seed_id(name)}-val", split=split,
                                 servers=[server], query=seed_query(name, description)))
    return seeds


@lru_cache(maxsize=4)
def _cached_file(path: str) -> tuple[McpTask, ...]:
    return tuple(load_task_file(Path(path)))


def task_file(path: Path) -> list[McpTask]:
    """``load_task_file`` cached per path (task lists are read on every ``/get_env_profile`` and ``/create``)."""
    return list(_cached_file(str(path)))


def final_answer(text: str, marker: str) -> str:
    """The text after the last ``marker`` (case aside), else the whole text, stripped."""
    index = text.lower().rfind(marker.lower()) if marker else -1
    answer = text[index + len(marker):] if index >= 0 else text
    return answer.strip().lstrip(":").strip()


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def check_answer(task: McpTask, answer: str | None) -> bool:
    """Whether ``answer`` passes the task's answer checker (not ``tool`` checkers: the env runs those)."""
    if answer is None:
        return False
    checker = task.checker or (Checker(type="contains") if task.answer is not None else None)
    if checker is None:
        return False
    value = checker.value if checker.value is not None else task.answer
    if checker.type == "contains":
        return _norm(str(value)) in _norm(answer)
    if checker.type == "exact":
        return _norm(str(value)) == _norm(answer)
    if checker.type == "regex":
        return re.search(str(value), answer) is not None
    if checker.type == "number":
        found = NUMBER.findall(answer)
        return bool(found) and math.isclose(float(found[-1]), float(value), rel_tol=checker.rel_tol, abs_tol=1e-9)
    raise ValueError(f"check_answer does not run {checker.type!r} checkers")
