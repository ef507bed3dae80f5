"""What the ablation knows about each run on disk: ``<run dir>/ablation_run.json`` and ``metrics.jsonl``.

A run is **done** when its state file says so (written after its launch exited 0 with the final step in
``metrics.jsonl``), or when ``metrics.jsonl`` already holds the final training step (the run finished but
the ablation was killed before it wrote the state). verl logs a step's line after that step's validation
and checkpoint, so the final step's line means the run is complete. Anything else is redone: the same
command again, with ``trainer.resume_mode=auto``: verl continues after the run's latest checkpoint
(``metrics.jsonl`` is appended to and its last line of a step wins), or starts afresh when there is none
(the runner first sets the old ``metrics.jsonl`` aside as ``metrics.before-attempt<N>.jsonl``).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentevolver.backends.cpu.precision import machine_summary
from agentevolver.errors import ConfigError
from agentevolver.experiments.plan import RunPlan

__all__ = ["METRICS_FILE", "STATE_FILE", "RunState", "final_step_logged", "now", "read_metrics_file", "relocate",
           "same_preset"]

#: Per-run state file, in the run's folder.
STATE_FILE = "ablation_run.json"
#: The trainer's per-step metrics (agentevolver.verl.tracking.METRICS_FILE).
METRICS_FILE = "metrics.jsonl"

#: Runner keys added after ablations were committed: a run stored without one is still the same command (it
#: ran before the runner set the key; resumed, it gets it). trainer.validation_data_dir: per-task records.
_LATER_RUNNER_KEYS = ("trainer.validation_data_dir",)

#: Keys that only a training step's line has (a validation-only line, e.g. step 0, has none of them).
_TRAINING_KEYS = ("timing_s/step", "actor/pg_loss", "training/global_step")
#: The prefix of verl's validation scores (``val-core/<data source>/...``).
_VALIDATION_PREFIX = "val-core/"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_metrics_file(run_dir: Path) -> dict[int, dict[str, float | None]]:
    """Step -> metrics of the run's ``metrics.jsonl`` ({} when there is none yet)."""
    from agentevolver.verl.tracking import read_metrics  # verl import: only when a run's metrics are read

    path = run_dir / METRICS_FILE
    return read_metrics(path) if path.is_file() else {}


def final_step_logged(run_dir: Path, total_steps: int | None) -> bool:
    """Whether ``metrics.jsonl`` holds the training line of step ``total_steps``; for 0 (a ``trainer.val_only``
    run, which trains no step) the step-0 validation line."""
    if total_steps is None:
        return False
    line = read_metrics_file(run_dir).get(total_steps) or {}
    if total_steps == 0:
        return any(key.startswith(_VALIDATION_PREFIX) for key in line)
    return any(key in line for key in _TRAINING_KEYS)


def relocate(texts: list[str], old_run_dir: Path | None, new_run_dir: Path) -> list[str]:
    """``texts`` with the paths of a checkout that moved rewritten to where it is now.

    A run folder is ``<root>/<out>/runs/<arm>/seed<k>``: when the stored and the current run folder end in
    the same relative path, their differing prefixes are the old and new checkout roots, and every text
    under the old root is moved under the new one (the preset, the run folder, the records). When they share
    less than the ablation's own folder, only that folder (``<out>``) is moved."""
    if old_run_dir is None or old_run_dir == new_run_dir:
        return list(texts)
    old_parts, new_parts = old_run_dir.parts, new_run_dir.parts
    common = 0
    while (common < min(len(old_parts), len(new_parts)) - 1
           and old_parts[-1 - common] == new_parts[-1 - common]):
        common += 1
    if common < 3:  # not even runs/<arm>/seed<k> in common: another run, compare as stored
        return list(texts)
    old_root = str(Path(*old_parts[:len(old_parts) - common]))
    new_root = str(Path(*new_parts[:len(new_parts) - common]))
    if common == 3:  # only runs/<arm>/seed<k>: the ablation folder itself moved (another --out)
        old_root, new_root = str(old_run_dir.parents[2]), str(new_run_dir.parents[2])
    return [_move_prefix(text, old_root, new_root) for text in texts]


#: The checkout this package runs from: a preset inside it is named by its path relative to it.
_CHECKOUT = Path(__file__).resolve().parents[2]


def same_preset(stored: str, current: Path) -> bool:
    """Whether the stored preset path names ``current``: the same path, or the same file of this project's
    checkout in another checkout (``<elsewhere>/examples/x.yaml`` for ``<here>/examples/x.yaml``).

    Why: runs are often started from a worktree whose folder is gone by the time their report is written
    from the main checkout (``--out`` absolute, so the run folders did not move and :func:`relocate` has
    nothing to go by)."""
    if Path(stored) == current:
        return True
    try:
        inside = current.resolve().relative_to(_CHECKOUT)
    except ValueError:  # a preset of the user's own, outside this checkout: only its own path names it
        return False
    return Path(stored).parts[-len(inside.parts):] == inside.parts


def _move_prefix(text: str, old_root: str, new_root: str) -> str:
    """Each path in ``text`` (the whole text, or an override's value) under ``old_root`` moved to ``new_root``."""
    key, sep, value = text.partition("=")
    if sep and not key.startswith("/"):
        return f"{key}={_move_prefix(value, old_root, new_root)}"
    if text == old_root or text.startswith(old_root.rstrip("/") + "/"):
        return new_root + text[len(old_root):]
    return text


class RunState:
    """``<run dir>/ablation_run.json``: the run's command, its attempts (start, end, wall time, exit status,
    the machine: :func:`~agentevolver.backends.cpu.precision.machine_summary`) and its status (new, running,
    done, failed, stopped)."""

    def __init__(self, run: RunPlan) -> None:
        self.run = run
        self.path = run.run_dir / STATE_FILE
        self.data: dict[str, Any] = {}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text(encoding="utf-8"))

    @property
    def status(self) -> str:
        return str(self.data.get("status", "new"))

    @property
    def attempts(self) -> list[dict[str, Any]]:
        return list(self.data.get("attempts", []))

    def check_same_command(self) -> None:
        """A run folder made with other overrides or another preset is not this run: refuse to mix them.

        The stored command holds absolute paths of the checkout it ran in; a clone of the same ablation
        elsewhere (another checkout, a CI machine) is the same command, so the stored paths are moved to
        this checkout first (:func:`relocate`). A runner key added since it ran (:data:`_LATER_RUNNER_KEYS`) is
        not a difference."""
        if not self.data:
            return
        stored = relocate([str(self.data.get("conf")), *self.data.get("overrides", [])], self.stored_run_dir(),
                          self.run.run_dir)
        if same_preset(stored[0], self.run.conf):
            stored[0] = str(self.run.conf)
        stored_keys = {str(override).partition("=")[0] for override in stored}
        current = [override for override in self.run.overrides
                   if override.partition("=")[0] not in _LATER_RUNNER_KEYS or override.partition("=")[0] in stored_keys]
        if stored != [str(self.run.conf), *current]:
            raise ConfigError(
                f"run {self.run.key}: {self.path} was made with another command (the preset, the arm's or the "
                f"shared overrides, or the command line's changed); use another --out, or delete "
                f"{self.run.run_dir} to run it again with the new one")

    def stored_run_dir(self) -> Path | None:
        """The run folder as the stored command named it (its ``trainer.default_local_dir``), if it did."""
        for override in self.data.get("overrides", []):
            key, _, value = str(override).partition("=")
            if key == "trainer.default_local_dir" and value:
                return Path(value)
        return None

    def is_done(self) -> bool:
        """Done per the state file, or finished according to its metrics (then the state file is written)."""
        if self.status == "done":
            return True
        if final_step_logged(self.run.run_dir, self.run.total_steps):
            self.data.setdefault("attempts", [])
            self.save(status="done", note="the final step is in metrics.jsonl; the ablation stopped before it "
                                          "recorded the run's end (its wall time is not known)")
            return True
        return False

    def begin(self, log: Path, from_step: int = 0) -> None:
        """A new attempt starts; ``from_step`` is the checkpoint step it resumes from (0: from scratch)."""
        attempts = self.attempts
        attempts.append({"started": now(), "log": str(log), "machine": machine_summary(), "from_step": from_step})
        self.save(status="running", attempts=attempts)

    def end(self, exit_code: int, wall_s: float, status: str, reason: str | None = None) -> None:
        attempts = self.attempts
        attempts[-1].update(finished=now(), wall_s=round(wall_s, 1), exit_code=exit_code)
        if reason:
            attempts[-1]["reason"] = reason
        self.save(status=status, attempts=attempts)

    def save(self, **changes: Any) -> None:
        self.data.update(arm=self.run.arm, seed=self.run.seed, experiment=self.run.experiment,
                         conf=str(self.run.conf), overrides=self.run.overrides, argv=self.run.argv, **changes)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2), encoding="utf-8")
        os.replace(tmp, self.path)

    def machines(self) -> list[dict[str, Any]]:
        """The machine of each attempt that recorded one, without repeats, in attempt order."""
        found: list[dict[str, Any]] = []
        for attempt in self.attempts:
            machine = attempt.get("machine")
            if isinstance(machine, dict) and machine not in found:
                found.append(machine)
        return found

    def wall_s(self) -> float | None:
        """Summed wall time of the attempts that ended, from the last one that started from scratch on (an
        attempt redone from step 0 throws the earlier ones' training away; one that resumed a checkpoint
        continues it); None when none ended. Attempts recorded without ``from_step`` all count."""
        attempts = self.attempts
        fresh = [i for i, a in enumerate(attempts) if a.get("from_step") == 0]
        times = [a["wall_s"] for a in attempts[fresh[-1] if fresh else 0:] if isinstance(a.get("wall_s"), int | float)]
        return float(sum(times)) if times else None
