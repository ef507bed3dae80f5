"""Per-task validation records, and the paired per-task comparison of two arms (McNemar, pooled over seeds).

**Where they come from.** Every ablation run sets ``trainer.validation_data_dir=<run dir>/validation``
(:data:`~agentevolver.experiments.plan.RUNNER_KEYS`), so verl writes ``<run dir>/validation/<step>.jsonl`` at
every validation: one line per validation sample with ``score`` (the reward), ``step``, and the agent loop's
``reward_extra_info``: ``acc`` (the episode's success), ``outcome`` and ``task_id``
(:func:`agentevolver.verl.agent_loop.to_agent_loop_output`). A ``val_compare_mode`` second pass writes into
``validation/exp_<mode>/`` (not read here). Reading verl's own dump covers every validation: the one before
training and ``trainer.val_only`` runs as well as the ones the ``testing`` stage runs.

**Kept small.** verl's dump holds every prompt and response (megabytes a validation), so it is not tracked in
git; :func:`keep_compact` condenses every dump of a run into ``<run dir>/validation_tasks.jsonl`` (step, task id,
score and success a line: tens of kB a run), which is tracked, and :func:`read_records` reads it where a dump is
gone (a later checkout of a finished ablation reports its per-task comparison all the same).

**Why per task.** Two arms' final validations differ by a few tasks; the seed-level difference
(:class:`~agentevolver.experiments.report.PairedDifference`) has a handful of samples and cannot see that.
Paired per task, the tasks solved by one arm and not the other are what carries the evidence; the exact
McNemar test asks whether those discordant counts are more lopsided than a fair coin would make them. The
counts are pooled over the seeds both arms finished (each (seed, task) is one pair).

**Solved.** A sample succeeds when its ``acc`` is 1 (the task fully solved; calc's is 0 or 1). A task is solved
by a run when at least half of its validation samples succeed: with greedy validation (``val_kwargs.n=1``, the
setting whose results do not move with timing: ``rollout.engine_kwargs.hf.batch_invariant_greedy``) that is its
one sample.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agentevolver.errors import ConfigError

__all__ = ["COMPACT_FILE", "VALIDATION_DIR", "McNemar", "TaskRecord", "keep_compact", "level_of", "mcnemar",
           "per_level", "read_records", "solved_tasks", "validation_steps"]

#: The run folder's subfolder verl's validation dump goes to (``trainer.validation_data_dir``).
VALIDATION_DIR = "validation"
#: Every validation's records of a run, condensed (module docstring); tracked in git beside metrics.jsonl.
COMPACT_FILE = "validation_tasks.jsonl"
#: ``acc`` at or above this is a success (1 with float slack).
_SUCCESS = 1.0 - 1e-6
#: Task ids of the form ``<split>-<level>-<index>`` (calc's: ``eval-word-007``) carry their level.
_LEVELED_ID = re.compile(r"^(?P<split>[A-Za-z0-9]+)-(?P<level>[A-Za-z_]+)-(?P<index>\d+)$")


@dataclass(frozen=True)
class TaskRecord:
    """One validation sample of one task."""

    task_id: str
    #: The task's level where its environment has levels (from the id: :func:`level_of`), else None.
    level: str | None
    step: int
    #: The reward (verl's ``score``).
    score: float
    #: The episode's success in 0..1 (the agent loop's ``acc``: the reward's success rate).
    success: float

    @property
    def solved(self) -> bool:
        return self.success >= _SUCCESS


def level_of(task_id: str) -> str | None:
    """The level a task id names (``eval-word-007`` -> ``word``); None for ids without one."""
    match = _LEVELED_ID.match(task_id)
    return match["level"] if match else None


def _dump_steps(run_dir: Path) -> list[int]:
    folder = run_dir / VALIDATION_DIR
    if not folder.is_dir():
        return []
    return sorted(int(path.stem) for path in folder.glob("*.jsonl") if path.stem.isdigit())


def validation_steps(run_dir: Path) -> list[int]:
    """The steps with per-task records: a validation dump ``<run dir>/validation/<step>.jsonl`` or, where it
    is gone, their condensed lines (:data:`COMPACT_FILE`), in order."""
    return sorted(set(_dump_steps(run_dir)) | {record.step for record in _read_compact(run_dir)})


def keep_compact(run_dir: Path) -> Path | None:
    """Condense every validation dump of ``run_dir`` into :data:`COMPACT_FILE` (the steps whose dump is gone
    keep their lines); None when the run has no record at all. Rewritten whole, so it is idempotent."""
    kept: dict[int, list[TaskRecord]] = {}  # step -> records
    for record in _read_compact(run_dir):
        kept.setdefault(record.step, []).append(record)
    for step in _dump_steps(run_dir):
        kept[step] = _read_dump(run_dir, step)
    if not kept:
        return None
    path = run_dir / COMPACT_FILE
    lines = [json.dumps({"step": step, "task_id": r.task_id, "score": r.score, "acc": r.success})
             for step in sorted(kept) for r in kept[step]]  # in the dump's order (per_level keeps it)
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    temporary.replace(path)
    return path


def read_records(run_dir: Path, step: int) -> list[TaskRecord]:
    """The records of the validation at ``step``: from verl's dump, or where it is gone from the condensed
    :data:`COMPACT_FILE` ([] when neither has that validation).

    Raises:
        ConfigError: a line is not JSON or lacks ``task_id`` / ``acc`` (a dump written before the agent loop put
            ``task_id`` into it, or not by verl), naming the file and line.
    """
    if (run_dir / VALIDATION_DIR / f"{step}.jsonl").is_file():
        return _read_dump(run_dir, step)
    return [record for record in _read_compact(run_dir) if record.step == step]


def _read_compact(run_dir: Path) -> list[TaskRecord]:
    path = run_dir / COMPACT_FILE
    return _parse(path, None) if path.is_file() else []


def _read_dump(run_dir: Path, step: int) -> list[TaskRecord]:
    return _parse(run_dir / VALIDATION_DIR / f"{step}.jsonl", step)


def _parse(path: Path, step: int | None) -> list[TaskRecord]:
    """Records of a dump (``step``: its validation's step, where a line lacks one) or of the compact file."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            task_id = str(row["task_id"])
            records.append(TaskRecord(task_id=task_id, level=level_of(task_id),
                                      step=int(row["step"] if step is None else row.get("step", step)),
                                      score=float(row["score"]), success=float(row["acc"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"{path}:{number}: not a validation record with task_id, score and acc ({type(err).__name__}: "
                f"{err}); the dump is verl's trainer.validation_data_dir with this project's agent loop, which "
                f"puts task_id into it: rerun the validation, or move the file away to report without it") from err
    return records


def solved_tasks(records: Iterable[TaskRecord]) -> dict[str, bool]:
    """Task id -> solved: at least half of the task's samples succeeded (module docstring)."""
    samples: dict[str, list[bool]] = defaultdict(list)
    for record in records:
        samples[record.task_id].append(record.solved)
    return {task: 2 * sum(flags) >= len(flags) for task, flags in samples.items()}


def per_level(records: Iterable[TaskRecord]) -> dict[str, float]:
    """Level -> mean success over its samples (``all`` over every sample); levels in order of appearance."""
    by_level: dict[str, list[float]] = defaultdict(list)
    every: list[float] = []
    for record in records:
        every.append(record.success)
        if record.level is not None:
            by_level[record.level].append(record.success)
    out = {level: statistics.fmean(values) for level, values in by_level.items()}
    if every:
        out["all"] = statistics.fmean(every)
    return out


@dataclass(frozen=True)
class McNemar:
    """Discordant pairs of two arms over (seed, task) pairs: tasks solved by ``arm`` and not ``baseline``
    (``only_arm``) and the reverse (``only_baseline``), with the exact two-sided McNemar p-value."""

    arm: str
    baseline: str
    only_arm: int
    only_baseline: int
    both: int
    neither: int
    #: The seeds whose final validations were paired.
    seeds: tuple[int, ...]

    @property
    def pairs(self) -> int:
        return self.only_arm + self.only_baseline + self.both + self.neither

    @property
    def p_value(self) -> float:
        """Exact McNemar: the two-sided binomial test of ``only_arm`` out of the discordant pairs at 1/2
        (scipy's ``binomtest``; 1 when there is no discordant pair)."""
        discordant = self.only_arm + self.only_baseline
        if discordant == 0:
            return 1.0
        from scipy.stats import binomtest

        return float(binomtest(self.only_arm, discordant, 0.5).pvalue)


def mcnemar(arm: str, baseline: str, pairs: Mapping[int, tuple[Mapping[str, bool], Mapping[str, bool]]]) -> McNemar:
    """Pool ``seed -> (arm's solved tasks, baseline's solved tasks)`` into one :class:`McNemar` count over the
    tasks both validated at each seed (a task only one of them ran is left out)."""
    only_arm = only_baseline = both = neither = 0
    for mine, theirs in pairs.values():
        for task in mine.keys() & theirs.keys():
            a, b = mine[task], theirs[task]
            only_arm += a and not b
            only_baseline += b and not a
            both += a and b
            neither += not a and not b
    return McNemar(arm, baseline, only_arm, only_baseline, both, neither, tuple(sorted(pairs)))
