"""What a training run shows and records per step, on top of verl's logger backends.

verl's ``console`` backend prints every metric of a step as one long ``key:value - key:value`` line (~150
keys), which nobody reads during a run. This module adds two backends for ``trainer.logger``:

* ``table``: one row per step with the numbers a user watches (reward, success, lengths, loss, KL, the
  rollout/update time split, env errors), a header every :data:`HEADER_EVERY` rows, and a line per
  validation with its ``val-core`` numbers;
* ``jsonl``: ``<trainer.default_local_dir>/metrics.jsonl``, one flat JSON object per logged step
  (``{"step": N, "<metric>": value, ...}``), appended and flushed line by line, so the trajectory viewer
  and scripts can read a run that is still going (verl's ``file`` backend truncates its file when a
  resumed run starts; a reader takes the last line of a step).

:class:`RunTracking` is verl's ``Tracking`` with those two names added; the trainer's loop
(:meth:`agentevolver.verl.step.trainer.AgentEvolverTrainer.fit`) builds it. With ``tensorboard`` in ``trainer.logger`` and no
``TENSORBOARD_DIR`` in the environment, the event files go to ``<run dir>/tensorboard`` (verl's default is
``tensorboard_log/`` under the working directory), so one folder holds a run's checkpoints, rollout dumps,
metrics and TensorBoard logs.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from verl.utils.tracking import Tracking

__all__ = ["HEADER_EVERY", "METRICS_FILE", "OWN_BACKENDS", "MetricsFile", "RunTracking", "StepTable",
           "read_metrics"]

#: Name of the per-step metrics file in the run directory.
METRICS_FILE = "metrics.jsonl"
#: Backends this module adds to verl's.
OWN_BACKENDS = ("table", "jsonl")
#: The table repeats its header after this many rows.
HEADER_EVERY = 20

#: (column title, metric keys tried in order, format) of the per-step table.
_COLUMNS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("reward", ("critic/score/mean",), "{:.3f}"),
    ("success", ("episode/success_rate",), "{:.0%}"),
    ("resp len", ("response_length/mean",), "{:.0f}"),
    ("turns", ("num_turns/mean",), "{:.1f}"),
    ("pg loss", ("actor/pg_loss",), "{:+.4f}"),
    ("kl", ("actor/kl_loss", "actor/ppo_kl"), "{:.4f}"),
    ("grad", ("actor/grad_norm",), "{:.3f}"),
    ("rollout s", ("timing_s/gen",), "{:.0f}"),
    ("update s", ("timing_s/update_actor",), "{:.0f}"),
    ("step s", ("timing_s/step",), "{:.0f}"),
    ("env err", ("episode/env_errors",), "{:.0f}"),
)


def _number(value: Any) -> float | None:
    """``value`` as a finite-or-not float when it is a real number (numpy and torch scalars included)."""
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number


def _flat_numbers(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The numeric metrics of ``data``; NaN/inf become None (JSON has no NaN)."""
    out: dict[str, float | None] = {}
    for key, value in data.items():
        number = _number(value)
        if number is not None:
            out[str(key)] = number if math.isfinite(number) else None
    return out


class MetricsFile:
    """The ``jsonl`` backend: appends ``{"step": N, ...metrics}`` to ``path``, one flushed line per call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        line = json.dumps({"step": int(step), **_flat_numbers(data)}, sort_keys=False)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def finish(self) -> None:  # every line is already on disk
        pass


def read_metrics(path: Path) -> dict[int, dict[str, float | None]]:
    """Step -> metrics of a ``metrics.jsonl``; a later line of the same step (a resumed run) wins; a torn
    last line (a run killed mid-write) is skipped."""
    steps: dict[int, dict[str, float | None]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            step = record.pop("step")
            steps.setdefault(step, {}).update(record)
    return steps


class StepTable:
    """The ``table`` backend: a row per training step, a line per validation (see the module docstring)."""

    def __init__(self, total_steps: int | None = None, console: Console | None = None) -> None:
        self.total_steps = total_steps
        self.console = console or Console(highlight=False, soft_wrap=False, width=160)
        self.rows = 0

    def log(self, data: Mapping[str, Any], step: int) -> None:
        validation = {k: v for k, v in data.items() if str(k).startswith("val-core/")}
        if validation:
            self._validation(validation, step)
        if "timing_s/step" in data or "actor/pg_loss" in data:
            self._row(data, step)

    def finish(self) -> None:
        pass

    def _validation(self, metrics: Mapping[str, Any], step: int) -> None:
        parts = []
        for key in sorted(metrics):
            number = _number(metrics[key])
            if number is not None:
                parts.append(f"{key.removeprefix('val-core/')} {number:.3f}")
        self.console.print(f"[bold]validation @ step {step}[/bold]: " + ", ".join(parts))

    def _row(self, data: Mapping[str, Any], step: int) -> None:
        table = Table(box=None, show_header=self.rows % HEADER_EVERY == 0, pad_edge=False, header_style="bold")
        width = len(str(self.total_steps)) * 2 + 1 if self.total_steps else 5
        table.add_column("step", justify="right", min_width=max(width, 4))
        cells = [f"{step}/{self.total_steps}" if self.total_steps else str(step)]
        for title, keys, fmt in _COLUMNS:
            table.add_column(title, justify="right", min_width=max(len(title), 8))
            value = next((_number(data[k]) for k in keys if k in data), None)
            cells.append("-" if value is None or not math.isfinite(value) else fmt.format(value))
        table.add_row(*cells)
        self.console.print(table)
        self.rows += 1


def logger_names(value: object) -> list[str]:
    """``trainer.logger`` as a list of backend names: verl takes one name or a list of them."""
    return [str(value)] if isinstance(value, str) else [str(name) for name in (value or [])]


def _run_dir(config: Mapping[str, Any] | None) -> Path | None:
    trainer = (config or {}).get("trainer") or {}
    folder = trainer.get("default_local_dir")
    return Path(str(folder)) if folder else None


class RunTracking(Tracking):
    """verl's ``Tracking`` plus the ``table`` and ``jsonl`` backends (see the module docstring)."""

    def __init__(self, project_name: str, experiment_name: str, default_backend: str | list[str] = "console",
                 config: Mapping[str, Any] | None = None) -> None:
        names = logger_names(default_backend)
        run_dir = _run_dir(config)
        if "tensorboard" in names and run_dir is not None and "TENSORBOARD_DIR" not in os.environ:
            os.environ["TENSORBOARD_DIR"] = str(run_dir / "tensorboard")
        super().__init__(project_name, experiment_name, [n for n in names if n not in OWN_BACKENDS], config)
        if "table" in names:
            total = ((config or {}).get("trainer") or {}).get("total_training_steps")
            self.logger["table"] = StepTable(int(total) if isinstance(total, int) and total > 0 else None)
        if "jsonl" in names:
            if run_dir is None:
                raise ValueError("trainer.logger has 'jsonl' but trainer.default_local_dir is not set: set it "
                                 "to the run's folder (metrics.jsonl is written there)")
            self.logger["jsonl"] = MetricsFile(run_dir / METRICS_FILE)

    def finish(self, exit_code: int = 0) -> None:
        if not getattr(self, "_finished", False):
            for name in OWN_BACKENDS:
                if name in getattr(self, "logger", {}):
                    self.logger[name].finish()
        super().finish(exit_code=exit_code)
