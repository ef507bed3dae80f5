"""Synchronous against asynchronous training on the CPU quickstart with slow tools: episodes per minute, one run.

    .venv/bin/python bench/async_trainer.py [--steps 5] [--rounds 1] [--tool-delay 1.5] [--out async.json] [--small]

Each round trains the quickstart twice through the real entry point (``python -m agentevolver.main_ppo``), on one
calc environment service the bench starts, whose every tool call takes ``--tool-delay`` seconds
(``+env_service.create_params.tool_delay_s``: a search or a sandbox, not a local calculator): ``trainer.mode=sync``
and ``trainer.mode=async trainer.max_staleness=1``. Both arms train the same tasks, in the same order, with the
same number of episodes per step; the order of the arms alternates between rounds. Validation and checkpoints
are off.

Measured per run, from ``metrics.jsonl``, over steps 2..N (step 1 has nothing to overlap: its rollout runs
alone in both arms): the loop's seconds per step (``timing_s/step``: in async training the time from one
step's end to the next's), episodes per minute, the rollout (``gen``) and the actor update, how long the async
trainer waited for the rollout (``async/wait_rollout_s``: for the step's episodes and before the weight sync) and the staleness it logged. The table gives each arm's
median over the rounds and async / sync. The CPU, its core count and the load average before and after are
printed with it. ``--small`` runs tiny-test for 3 steps (a smoke run of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from paired_runs import cpu_model, load, median_of, quickstart_command, ratio_table, run_logged, run_rounds  # noqa: E402

from agentevolver.verl.tracking import read_metrics  # noqa: E402

ARMS = {"sync": ["trainer.mode=sync"], "async": ["trainer.mode=async", "trainer.max_staleness=1"]}


def run_arm(arm: str, url: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One training run of ``arm``: its per-step times and what the async loop logged."""
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = folder / arm
    command = quickstart_command("quickstart", url, run_dir, args.steps,
                                 f"+env_service.create_params.tool_delay_s={args.tool_delay}", *ARMS[arm],
                                 *(args.async_extra if arm == "async" else []), small=args.small)
    wall_s, _ = run_logged(command, folder, arm)
    steps = read_metrics(run_dir / "metrics.jsonl")
    later = [s for s in sorted(steps) if s > 1]
    loop_s = sum(steps[s]["timing_s/step"] for s in later)
    return {
        "arm": arm,
        "step_s": median_of(steps, "timing_s/step", later),
        "episodes_per_min": args.episodes_per_step * len(later) / loop_s * 60,
        "gen_s": median_of(steps, "timing_s/gen", later),
        "update_actor_s": median_of(steps, "timing_s/update_actor", later),
        "wait_rollout_s": median_of(steps, "async/wait_rollout_s", later),
        "staleness_max": max((steps[s].get("async/staleness_max", 0.0) for s in steps), default=0.0),
        "score": statistics.mean(steps[s]["critic/score/mean"] for s in steps),
        "wall_s": wall_s,
        "per_step_s": {s: steps[s].get("timing_s/step") for s in sorted(steps)},
    }


ROWS = [
    ("seconds per step (steps 2..N)", lambda r: r["step_s"]),
    ("episodes per minute", lambda r: r["episodes_per_min"]),
    ("rollout `gen` (s)", lambda r: r["gen_s"]),
    ("actor update (s)", lambda r: r["update_actor_s"]),
    ("trainer waited for the rollout (s)", lambda r: r["wait_rollout_s"]),
    ("staleness (max)", lambda r: r["staleness_max"]),
    ("mean score over the steps", lambda r: r["score"]),
    ("whole command (s)", lambda r: r["wall_s"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="training steps per run (>= 3)")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs; the order alternates")
    parser.add_argument("--tool-delay", type=float, default=1.5, help="seconds per calc tool call")
    parser.add_argument("--arms", default="sync,async", help="the arms to run, in the first round's order")
    parser.add_argument("--async-extra", action="append", default=[], metavar="OVERRIDE",
                        help="an override for the async arm only (repeatable), e.g. a thread count")
    parser.add_argument("--out", type=Path, help="write every run's numbers as JSON")
    parser.add_argument("--small", action="store_true", help="tiny-test, 3 steps: a smoke run of the script")
    args = parser.parse_args()
    if args.small:
        args.steps = 3
    if args.steps < 3:
        parser.error("--steps must be >= 3 (step 1 has nothing to overlap)")
    from agentevolver.config import compose_config

    quickstart = compose_config([], config_name="quickstart")
    args.episodes_per_step = int(quickstart.data.train_batch_size) * int(quickstart.actor_rollout_ref.rollout.n)
    print(f"CPU: {cpu_model()}, {psutil.cpu_count(logical=False)} cores; load average before: {load()}; tool "
          f"delay {args.tool_delay:g} s per call; {args.episodes_per_step} episodes per step", flush=True)
    results = run_rounds(args.arms.split(","), args.rounds, lambda arm, url, folder: run_arm(arm, url, folder, args),
                         lambda r: f"{r['step_s']:.1f} s per step, {r['episodes_per_min']:.1f} episodes/min",
                         args.out, "async_bench_")
    print(f"load average after: {load()}")
    if {"sync", "async"} <= {result["arm"] for result in results}:
        print(ratio_table(results, ROWS, "sync", "async", ("sync", "async (staleness 1)")))


if __name__ == "__main__":
    main()
