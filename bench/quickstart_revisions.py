"""The quickstart at two git revisions, in turn: validation curve and step time, as a table with ratios.

Why: a refactor of the training step must keep behaviour ("the same seeded validation curve, step time
within 1.1x"), and only the real main job shows both. Each revision is checked out as a detached git
worktree in a temporary folder and runs ``launcher.py --conf examples/quickstart.yaml --with-env`` there,
with this interpreter (the same virtualenv for both: only the project's code differs) and ``PYTHONPATH``
set to that worktree, so the worktree's packages shadow the editable install. Rounds alternate the order
(before, after, after, before, ...) so a drift of the machine's load falls on both.

Run it on an idle machine (``uptime``) and state the load beside the figures; one round is two quickstarts
(about 7 minutes each on 2 idle cores)::

    .venv/bin/python bench/quickstart_revisions.py --before 3f12954 --after HEAD --rounds 1

Extra Hydra overrides for both runs go after ``--`` (e.g. ``-- trainer.total_training_steps=2``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
METRICS = Path("checkpoints") / "agentevolver" / "quickstart" / "metrics.jsonl"
VALIDATION_PREFIX = "val-core/"
VALIDATION_SUFFIX = "/acc/mean@1"
#: Since issue 26 every stage is timed every step, and one that did not run logs ~0 s (its timer's own cost).
EXTRA_WORK_S = 0.5


@dataclass
class QuickstartRun:
    """What one quickstart at one revision measured."""

    revision: str
    wall_s: float
    exit_code: int
    validation: dict[int, float] = field(default_factory=dict)  # step -> greedy validation success
    step_s: list[float] = field(default_factory=list)  # timing_s/step of each training step
    tokens: list[float] = field(default_factory=list)  # perf/total_num_tokens of each training step
    #: Per training step: did it validate or save (timing_s/testing or save_checkpoint of EXTRA_WORK_S or more)?
    #: Since issue 26 the step timer covers validation and checkpointing (the step's last stages); before, they
    #: were outside it. The ratios compare the steps that did neither, so both revisions time the same work.
    extra_work: list[bool] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)  # timing_s/<stage> -> seconds per step


def resolve(revision: str) -> str:
    """The full commit of ``revision``; a clear message when git does not know it."""
    done = subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"--before/--after: git does not know the revision {revision!r} ({done.stderr.strip()})")
    return done.stdout.strip()


def read_run(revision: str, metrics_file: Path, wall_s: float, exit_code: int) -> QuickstartRun:
    """The validation success per step and the training steps' seconds from a run's ``metrics.jsonl``."""
    run = QuickstartRun(revision=revision, wall_s=wall_s, exit_code=exit_code)
    if not metrics_file.exists():
        return run
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        step = int(row.get("step", 0))
        for key, value in row.items():
            if key.startswith(VALIDATION_PREFIX) and key.endswith(VALIDATION_SUFFIX):
                run.validation[step] = float(value)
        if "timing_s/step" in row:
            run.step_s.append(float(row["timing_s/step"]))
            run.tokens.append(float(row.get("perf/total_num_tokens", 0.0)))
            run.extra_work.append(any(float(row.get(f"timing_s/{stage}", 0.0)) >= EXTRA_WORK_S
                                      for stage in ("testing", "save_checkpoint")))
            for key, value in row.items():
                # the step's own stages (timing_s/<stage>), not the agent loop's per-episode statistics
                if (key.startswith("timing_s/") and key.count("/") == 1 and key != "timing_s/step"
                        and isinstance(value, int | float)):
                    run.stages.setdefault(key[len("timing_s/"):], []).append(float(value))
    return run


def run_quickstart(commit: str, overrides: list[str], work: Path) -> QuickstartRun:
    """One quickstart in a fresh worktree of ``commit`` (removed afterwards)."""
    tree = work / f"{commit[:12]}-{time.monotonic_ns()}"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=REPO_ROOT, check=True)
    try:
        env = dict(os.environ, PYTHONPATH=str(tree))
        argv = [sys.executable, "launcher.py", "--conf", "examples/quickstart.yaml", "--with-env"]
        if overrides:
            argv += ["--", *overrides]
        log = work / f"{tree.name}.log"
        started = time.perf_counter()
        with log.open("w", encoding="utf-8") as out:
            code = subprocess.run(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        run = read_run(commit, tree / METRICS, time.perf_counter() - started, code)
        if (tree / METRICS).exists():  # kept beside the log: the stage timings can be read again later
            (work / f"{tree.name}.metrics.jsonl").write_bytes((tree / METRICS).read_bytes())
        if code != 0:
            print(f"quickstart at {commit[:12]} exited with {code}; its output: {log}", file=sys.stderr)
        return run
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO_ROOT, check=False)


def table(before: list[QuickstartRun], after: list[QuickstartRun]) -> str:
    """The markdown table: each run's curve and step time, then the after/before ratio of the medians."""
    lines = ["| revision | validation success by step | median step s | steps s | whole command s | exit |",
             "|---|---|---|---|---|---|"]
    for run in [*before, *after]:
        curve = " -> ".join(f"{100 * v:.1f}%" for _s, v in sorted(run.validation.items())) or "-"
        median = f"{statistics.median(run.step_s):.1f}" if run.step_s else "-"
        steps = " / ".join(f"{s:.0f}" for s in run.step_s) or "-"
        lines.append(f"| {run.revision[:12]} | {curve} | {median} | {steps} | {run.wall_s:.0f} | {run.exit_code} |")
    b = [s for run in before for s, extra in zip(run.step_s, _flags(run), strict=True) if not extra]
    a = [s for run in after for s, extra in zip(run.step_s, _flags(run), strict=True) if not extra]
    if a and b:
        ratio = statistics.median(a) / statistics.median(b)
        lines += ["", f"median step time of the steps that neither validate nor save, after / before: **{ratio:.2f}x** "
                      f"({len(a)} and {len(b)} steps)"]
        per_token = [_per_1k_tokens(runs) for runs in (before, after)]
        if all(per_token):
            lines.append(f"seconds per 1,000 trained tokens (the samples differ run to run), after / before: "
                         f"**{per_token[1] / per_token[0]:.2f}x** ({per_token[0]:.2f} and {per_token[1]:.2f} s)")
        lines += ["", stage_table(before, after)]
    return "\n".join(lines)


def _flags(run: QuickstartRun) -> list[bool]:
    """Which steps validated or saved (all False for a run read before the flags existed)."""
    return run.extra_work if len(run.extra_work) == len(run.step_s) else [False] * len(run.step_s)


def _per_1k_tokens(runs: list[QuickstartRun]) -> float:
    """Seconds per 1,000 tokens over the steps that neither validate nor save (0 when none logged tokens)."""
    pairs = [(s, t) for run in runs for s, t, extra in zip(run.step_s, run.tokens, _flags(run), strict=False)
             if not extra]
    tokens = sum(t for _, t in pairs)
    return 1000 * sum(s for s, _ in pairs) / tokens if tokens else 0.0


def stage_table(before: list[QuickstartRun], after: list[QuickstartRun]) -> str:
    """Median seconds per step of each timed stage, before and after (a stage one revision lacks shows -)."""
    def medians(runs: list[QuickstartRun]) -> dict[str, float]:
        pooled: dict[str, list[float]] = {}
        for run in runs:
            for stage, values in run.stages.items():
                pooled.setdefault(stage, []).extend(values)
        return {stage: statistics.median(values) for stage, values in pooled.items()}

    b, a = medians(before), medians(after)
    lines = ["| stage (timing_s/) | before s | after s |", "|---|---|---|"]
    def cell(values: dict[str, float], stage: str) -> str:
        return f"{values[stage]:.1f}" if stage in values else "-"

    for stage in sorted(set(b) | set(a), key=lambda name: (-max(b.get(name, 0.0), a.get(name, 0.0)), name)):
        lines.append(f"| {stage} | {cell(b, stage)} | {cell(a, stage)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="3f12954", help="the revision to compare against")
    parser.add_argument("--after", default="HEAD", help="the revision under test")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, the order alternating")
    parser.add_argument("--after-first", action="store_true",
                        help="start the alternation with the 'after' revision (to pair with an earlier invocation)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="a folder for each run's log and metrics.jsonl (default: a temporary one, removed)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs (after --)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    before_commit, after_commit = resolve(args.before), resolve(args.after)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (measure idle)", flush=True)
    before: list[QuickstartRun] = []
    after: list[QuickstartRun] = []
    with tempfile.TemporaryDirectory(prefix="quickstart-revisions-") as tmp:
        work = Path(tmp)
        if args.keep is not None:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
        for index in range(args.rounds):
            order = [(before_commit, before), (after_commit, after)]
            for commit, runs in order if (index + args.after_first) % 2 == 0 else order[::-1]:
                runs.append(run_quickstart(commit, args.overrides, work))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(table(before, after))
    return 0 if all(run.exit_code == 0 for run in [*before, *after]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
