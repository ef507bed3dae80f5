"""Find the runs under the viewer's root folder and read their files without trusting them.

A run is a trainer output folder (``trainer.default_local_dir``) or a rollout-only job's ``--run-dir``: it
holds ``rollouts/step_<N>.jsonl`` (docs/rollout_dumps.md) and/or ``metrics.jsonl`` (one JSON object per
training step). A folder that directly holds ``step_<N>.jsonl`` files (``agent_flow.dump.dir`` pointed
somewhere else) is a run too. Everything here is re-read when a file changes (size or mtime), so a run
that is still writing shows its new steps on the next page load.

Why a tolerant reader next to :func:`agentevolver.module.agent_flow.read_rollout_dump`: that one fails at
the first bad line, which is right for scripts; the viewer instead shows every good episode and names each
bad line on the page, and skips a metrics line that is still being written.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from agentevolver.module.agent_flow.dump import ROLLOUT_DIR_NAME, rollout_dump_path

__all__ = [
    "METRICS_FILE",
    "DumpFile",
    "FileCache",
    "MetricsFile",
    "Run",
    "ViewerError",
    "discover_runs",
    "list_steps",
    "read_dump_file",
    "read_metrics_file",
    "resolve_run",
]

#: A run's metrics log: ``{"step": N, "<name>": number, ...}`` per line, or verl's file-logger shape
#: ``{"step": N, "data": {"<name>": number, ...}}``.
METRICS_FILE = "metrics.jsonl"
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")
#: Folders never searched for runs (they are big and never hold one).
_SKIP_DIRS = {ROLLOUT_DIR_NAME, "node_modules", "__pycache__", "wandb", "tensorboard_log"}


class ViewerError(Exception):
    """Something the page should explain to the user (missing run or step, corrupt file, bad parameter)."""

    def __init__(self, message: str, *, status: int = 404, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.hint = hint
        self.field = field  # the query parameter to change (run, step, line, sample), for JSON answers


@dataclass(frozen=True)
class Run:
    """One run: ``id`` is its path relative to the root (``.`` when the root is the run)."""

    id: str
    path: Path
    dump_dir: Path

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE


def _has_step_files(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return any(_STEP_FILE.match(entry.name) for entry in entries)
    except OSError:
        return False


def _as_run(root: Path, folder: Path) -> Run | None:
    """The run stored in ``folder``, or None when it holds neither dumps nor metrics."""
    run_id = folder.relative_to(root).as_posix() if folder != root else "."
    if (folder / ROLLOUT_DIR_NAME).is_dir() or (folder / METRICS_FILE).is_file():
        return Run(run_id, folder, folder / ROLLOUT_DIR_NAME)
    if _has_step_files(folder):
        return Run(run_id, folder, folder)
    return None


def discover_runs(root: Path, max_depth: int = 4) -> list[Run]:
    """Runs at or below ``root`` (at most ``max_depth`` folders down), sorted by id; [] if root is missing.

    A run's own sub-folders are not searched (checkpoints, dumps), nor hidden folders.
    """
    root = root.resolve()
    if not root.is_dir():
        return []
    runs: list[Run] = []

    def walk(folder: Path, depth: int) -> None:
        run = _as_run(root, folder)
        if run is not None:
            runs.append(run)
            return
        if depth >= max_depth:
            return
        try:
            with os.scandir(folder) as entries:
                children = sorted(entry.name for entry in entries
                                  if entry.is_dir(follow_symlinks=False) and not entry.name.startswith(".")
                                  and entry.name not in _SKIP_DIRS)
        except OSError:
            return
        for name in children:
            walk(folder / name, depth + 1)

    walk(root, 0)
    return sorted(runs, key=lambda run: run.id)


def resolve_run(root: Path, run_id: str) -> Run:
    """The run ``run_id`` (a path relative to ``root``); refuses paths that leave the root."""
    root = root.resolve()
    if not root.is_dir():
        raise ViewerError(f"the viewer's root folder {root} does not exist (yet)", field="run",
                          hint="start the viewer with --root pointing at a run folder or a folder of runs; "
                               "a training run creates its folder when it writes its first step")
    try:
        folder = (root / run_id).resolve()
        is_dir = folder.is_dir()
    except (ValueError, OSError) as err:  # a NUL byte, a name longer than the file system allows
        raise ViewerError(f"run {run_id[:200]!r} is not a usable path: {getattr(err, 'strerror', None) or err}",
                          status=400, field="run", hint="pick a run from the list on the start page") from None
    if folder != root and not folder.is_relative_to(root):
        raise ViewerError(f"run {run_id!r} is outside the viewer's root {root}", status=400, field="run")
    if not is_dir:
        raise ViewerError(f"run {run_id!r} not found under {root}", hint="pick a run from the list on the start page",
                          field="run")
    run = _as_run(root, folder)
    if run is None:
        raise ViewerError(f"{folder} is not a run: it holds neither {ROLLOUT_DIR_NAME}/step_<N>.jsonl nor "
                          f"{METRICS_FILE}", field="run")
    return run


def list_steps(run: Run) -> list[int]:
    """The steps that have a dump file, ascending (temporary files of a step being written are ignored)."""
    try:
        with os.scandir(run.dump_dir) as entries:
            steps = [int(match.group(1)) for entry in entries if (match := _STEP_FILE.match(entry.name))]
    except OSError:
        return []
    return sorted(steps)


def step_path(run: Run, step: int) -> Path:
    return rollout_dump_path(run.dump_dir, step)


@dataclass
class DumpFile:
    """The parsed records of one step file, each with its 1-based line number, and the lines that failed.

    ``derived`` holds what pages compute from the records (the table rows), so it lives and dies with
    this version of the file in the cache.
    """

    path: Path
    records: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    derived: dict[str, Any] = field(default_factory=dict)

    def record_at(self, line: int) -> dict[str, Any]:
        for number, record in self.records:
            if number == line:
                return record
        raise ViewerError(f"{self.path.name} has no episode on line {line}",
                          hint="pick an episode from the step's table", field="line")


@dataclass
class MetricsFile:
    """``series[name]`` = [(step, value), ...] sorted by step; ``problems`` names the lines that failed."""

    path: Path
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    lines: int = 0

    def at_step(self, step: int) -> dict[str, float]:
        return {name: value for name, points in self.series.items() for s, value in points if s == step}


def read_dump_file(path: Path) -> DumpFile:
    """Every JSON-object line of ``path``; bad lines become problems (the file must exist)."""
    dump = DumpFile(path)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = list(enumerate(handle, start=1))
    except FileNotFoundError as err:
        raise ViewerError(f"{path} does not exist") from err
    except OSError as err:
        raise ViewerError(f"cannot read {path}: {err.strerror}", status=500) from err
    for number, line in lines:
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as err:
            dump.problems.append(f"line {number}: not valid JSON ({err.msg} at column {err.colno})")
            continue
        if not isinstance(value, dict):
            dump.problems.append(f"line {number}: a JSON {type(value).__name__}, not an episode object")
            continue
        dump.records.append((number, value))
    return dump


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if value == value and abs(value) != float("inf") else None


def read_metrics_file(path: Path) -> MetricsFile:
    """The numeric metrics of ``path`` per step; a last line without newline is still being written."""
    metrics = MetricsFile(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError as err:
        raise ViewerError(f"{path} does not exist") from err
    except OSError as err:
        raise ViewerError(f"cannot read {path}: {err.strerror}", status=500) from err
    lines = text.split("\n")
    if lines and lines[-1]:
        lines = lines[:-1]  # the writer is in the middle of this line; it will be complete on the next read
    series: dict[str, dict[int, float]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        metrics.lines += 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            metrics.problems.append(f"line {number}: not valid JSON ({err.msg} at column {err.colno})")
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            metrics.problems.append(f"line {number}: no integer \"step\" field")
            continue
        values = row["data"] if isinstance(row.get("data"), dict) else row
        for name, raw in values.items():
            value = _number(raw)
            if name != "step" and value is not None:
                series.setdefault(name, {})[step] = value  # a re-logged step (resume) replaces the old value
    metrics.series = {name: sorted(points.items()) for name, points in sorted(series.items())}
    return metrics


T = TypeVar("T")


class FileCache:
    """Parsed files keyed by path, re-read when their size or mtime changes; the ``size`` newest are kept.

    Dump files can be tens of MB; parsing one on every click would make the episode pages slow.
    """

    def __init__(self, size: int = 6) -> None:
        self._size = size
        self._items: OrderedDict[tuple[Path, str], tuple[tuple[int, int], Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: Path, reader: Callable[[Path], T]) -> T:
        try:
            info = path.stat()
        except FileNotFoundError as err:
            raise ViewerError(f"{path} does not exist", field="step",
                              hint="the step may not be written yet, or the run folder moved") from err
        stamp = (info.st_mtime_ns, info.st_size)
        key = (path, reader.__name__)
        with self._lock:
            cached = self._items.get(key)
            if cached is not None and cached[0] == stamp:
                self._items.move_to_end(key)
                return cached[1]
        value = reader(path)
        with self._lock:
            self._items[key] = (stamp, value)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value
