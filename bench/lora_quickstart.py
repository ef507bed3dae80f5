"""LoRA against full fine-tuning on the CPU quickstart: memory and step time, as ratios measured in one run.

    .venv/bin/python bench/lora_quickstart.py [--steps 4] [--rounds 1] [--out lora.json] [--small]

Each round trains the quickstart twice through the real entry point (``python -m agentevolver.main_ppo``), on one
calc environment service the bench starts: ``--config-name quickstart`` (full fine-tuning) and ``--config-name
quickstart_lora`` (the same run with verl's FSDP LoRA: rank 16, alpha 32, every linear layer, adapters synced to
the hf server, adapter-only checkpoints). The order alternates between rounds, so a change of load does not
always hit the same arm. Validation is off; the last step saves a checkpoint.

Measured per run:

* **memory**: the run's process tree (driver, Ray's daemons and workers) is polled every 0.5 s: the peak resident
  set (RSS) of the training worker (verl's ``WorkerDict``: the FSDP model, its gradients and AdamW state, the
  activations), of the rollout server (``HFRolloutServer``) and of the whole tree (the sum of every process's RSS
  at one poll); every 2 s also the two workers' unique set (USS: private pages only; RSS also counts pages shared
  with other processes, such as Ray's object store, through which the weight sync passes);
* **time**: verl's ``timing_s/*`` of every step from ``metrics.jsonl``: the step (median of the steps that neither
  warm up nor save: 2 .. N-1), and the stages the two arms differ in (median of steps 2 .. N): the actor update
  (also per 1,000 tokens of the batch, ``perf/total_num_tokens``: the two arms' policies differ, and so do their
  response lengths), the weight sync (``update_weights``) and generation (``gen``);
* **checkpoint**: the bytes of the last step's ``global_step_<N>/actor`` folder.

The table gives each arm's median over the rounds and LoRA / full. The CPU, its core count and the load average
(``uptime``) before and after are printed with it: on a shared machine the times move with the load, the
memory far less. ``--small`` runs tiny-test for 3 steps (a smoke run of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.verl.tracking import read_metrics  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from paired_runs import cpu_model, load, median_of, quickstart_command, ratio_table, run_logged, run_rounds  # noqa: E402

ARMS = {"full": "quickstart", "lora": "quickstart_lora"}
#: Process roles by the title Ray gives a worker process (``ray::<ActorClass>...``).
ROLES = {"training worker": ("WorkerDict", "ActorRolloutRefWorker"), "rollout server": ("HFRolloutServer",)}
GIB = 2**30


class TreeMemory:
    """Polls a process tree's resident memory in a thread: peak per role and peak of the whole tree."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak: dict[str, int] = {role: 0 for role in ROLES} | {"whole run": 0}
        self.peak_uss: dict[str, int] = {role: 0 for role in ROLES}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _role(self, process: psutil.Process) -> str | None:
        title = " ".join(process.cmdline())
        for role, names in ROLES.items():
            if any(name in title for name in names):
                return role
        return None

    def _run(self) -> None:
        polls = 0
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            full = polls % 4 == 0  # USS reads /proc/<pid>/smaps: every 4th poll, and only for the two roles
            for process in processes:
                try:
                    rss = process.memory_info().rss
                    role = self._role(process)
                    total += rss
                    if role is not None:
                        self.peak[role] = max(self.peak[role], rss)
                        if full:
                            self.peak_uss[role] = max(self.peak_uss[role], process.memory_full_info().uss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak["whole run"] = max(self.peak["whole run"], total)
            polls += 1
            self._stop.wait(self.interval_s)


def run_arm(arm: str, url: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One training run of ``arm``: its peak memory, stage times and checkpoint size."""
    folder.mkdir(parents=True, exist_ok=True)
    run_dir = folder / arm
    command = quickstart_command(ARMS[arm], url, run_dir, args.steps, *(["agent_flow.max_steps=2"] if args.small else []),
                                 save_freq=args.steps, small=args.small)
    wall_s, memory = run_logged(command, folder, arm, watch=TreeMemory)
    steps = read_metrics(run_dir / "metrics.jsonl")
    later = [s for s in sorted(steps) if s > 1]
    plain = [s for s in later if s < args.steps] or later  # steps that neither warm up nor save
    median = partial(median_of, steps)

    checkpoint = run_dir / f"global_step_{args.steps}" / "actor"
    return {
        "arm": arm,
        "peak_gib": {role: value / GIB for role, value in memory.peak.items()},
        "peak_uss_gib": {role: value / GIB for role, value in memory.peak_uss.items()},
        "step_s": median("timing_s/step", plain),
        "update_actor_s": median("timing_s/update_actor", later),
        "update_per_1k_tokens_s": statistics.median(
            steps[s]["timing_s/update_actor"] / steps[s]["perf/total_num_tokens"] * 1000 for s in later),
        "update_weights_s": median("timing_s/update_weights", later),
        "gen_s": median("timing_s/gen", later),
        "checkpoint_mib": sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file()) / 2**20,
        "wall_s": wall_s,
        "response_tokens": median("response_length/mean", later),
        "per_step_s": {s: steps[s].get("timing_s/step") for s in sorted(steps)},
    }


ROWS = [
    ("training worker peak RSS (GiB)", lambda r: r["peak_gib"]["training worker"]),
    ("training worker peak USS (GiB)", lambda r: r["peak_uss_gib"]["training worker"]),
    ("rollout server peak RSS (GiB)", lambda r: r["peak_gib"]["rollout server"]),
    ("rollout server peak USS (GiB)", lambda r: r["peak_uss_gib"]["rollout server"]),
    ("whole run peak RSS (GiB)", lambda r: r["peak_gib"]["whole run"]),
    ("step (s)", lambda r: r["step_s"]),
    ("actor update (s)", lambda r: r["update_actor_s"]),
    ("actor update per 1k tokens (s)", lambda r: r["update_per_1k_tokens_s"]),
    ("weight sync (s)", lambda r: r["update_weights_s"]),
    ("generation (s)", lambda r: r["gen_s"]),
    ("response length (tokens, mean)", lambda r: r["response_tokens"]),
    ("checkpoint (MiB)", lambda r: r["checkpoint_mib"]),
    ("whole command (s)", lambda r: r["wall_s"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (>= 3)")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs; the order alternates")
    parser.add_argument("--out", type=Path, help="write every run's numbers as JSON")
    parser.add_argument("--small", action="store_true", help="tiny-test, 3 steps: a smoke run of the script")
    args = parser.parse_args()
    if args.small:
        args.steps = 3
    if args.steps < 3:
        parser.error("--steps must be >= 3 (step 1 warms up, the last one saves)")
    print(f"CPU: {cpu_model()}, {psutil.cpu_count(logical=False)} cores; load average before: {load()}", flush=True)
    results = run_rounds(["full", "lora"], args.rounds, lambda arm, url, folder: run_arm(arm, url, folder, args),
                         lambda r: f"step {r['step_s']:.1f} s, training worker {r['peak_gib']['training worker']:.2f} GiB",
                         args.out, "lora_bench_")
    print(f"load average after: {load()}")
    print(ratio_table(results, ROWS, "full", "lora", ("full fine-tuning", "LoRA")))


if __name__ == "__main__":
    main()
