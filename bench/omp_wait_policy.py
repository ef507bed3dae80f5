"""OpenMP's wait policy on a shared CPU: the CPU generator and the actor update, alone and two at a time.

    .venv/bin/python bench/omp_wait_policy.py [--repeats 2] [--policies default,passive]
                                              [--workloads decode,update] [--together 1,2]

torch's CPU kernels run on an OpenMP thread team (GNU libgomp in the PyPI wheels). Between two parallel
regions a team's idle threads busy-wait for the next one (``OMP_WAIT_POLICY`` unset: libgomp spins for a
while before it sleeps). Alone on its cores that is the fastest choice. Beside another process that computes
(two pytest-xdist workers on a 2-core machine, a Ray worker beside a service) a spinning thread holds a core
the other process's threads need, and a decode step is hundreds of small parallel regions, each ending at a
barrier that waits for a descheduled thread. Settings compared, each in fresh processes (libgomp reads its
environment when torch loads it):

* ``default``: ``OMP_WAIT_POLICY`` unset;
* ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once);
* ``active``: ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=300000``, what the CPU preset's ``auto`` gives
  the Ray workers: libgomp's one-team spin, kept when a process holds more OpenMP threads than cores (libgomp
  then cuts its spin to 1,000 iterations unless the policy is ACTIVE).

Workloads, each in its own process:

* ``decode``: the batched CPU generator (``rollout.dtype: auto``), 16 greedy rows of 48 tokens after a short
  prompt, decoded in the generator's worker thread as the rollout server does: no torch work on the main
  thread first (the plain generator's path; ``batch_invariant_greedy``'s start-up probe computes on the
  calling thread first, which changes libgomp's spin, so it is not used here);
* ``decode_two_teams``: ``decode`` after another thread of the process has computed with torch and stays
  alive, as in the training worker that hosts the rollout server (``trainer.rollout_server=worker``): the
  update's thread keeps its OpenMP team, so the process holds more OpenMP threads than cores;
* ``update``: forward + backward + AdamW over 4 x 256 tokens (fp32).

``--together 2`` starts two copies of the same workload at once (what two xdist workers, or two runs, do);
the figure is the slower copy's wall time. The settings alternate inside each repeat; the table gives the
median and the ratio to ``default`` in the same condition.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: setting -> its environment
POLICIES: dict[str, dict[str, str]] = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
                                        "active": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}}
WORKLOADS = ("decode", "decode_two_teams", "update")


def worker(workload: str, model_name: str) -> None:
    """Run one workload in this process; print its wall seconds as JSON (the parent reads the last line)."""
    import asyncio

    import torch

    from agentevolver.backends.cpu import HFGenerator
    from agentevolver.models import resolve_model_path

    path = str(resolve_model_path(model_name))
    if workload == "decode_two_teams":
        import threading

        done = threading.Event()

        def other_team() -> None:
            weights = torch.randn(512, 512)
            for _ in range(20):
                weights = torch.nn.functional.normalize(weights @ weights)
            done.wait()

        threading.Thread(target=other_team, daemon=True).start()
        time.sleep(1.0)
    if workload in ("decode", "decode_two_teams"):
        generator = HFGenerator.from_pretrained(path, dtype="auto", seed=0, max_batch_size=16, default_max_tokens=48)
        prompts = [generator.tokenizer(f"Question {i}: compute {7 * i} + {13 * i} step by step.")["input_ids"]
                   for i in range(16)]
        params = {"temperature": 0.0, "max_tokens": 48, "ignore_eos": True}

        async def run() -> float:
            begin = time.perf_counter()
            await asyncio.gather(*(generator.generate(f"r{i}", prompt_ids=list(p), sampling_params=params)
                                   for i, p in enumerate(prompts)))
            wall = time.perf_counter() - begin
            await generator.aclose()
            return wall

        wall = asyncio.run(run())
    else:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        ids = torch.randint(0, model.config.vocab_size, (4, 256))
        begin = time.perf_counter()
        for _ in range(2):
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        wall = time.perf_counter() - begin
    print(json.dumps({"wall": wall}))


def measure(workload: str, env: dict[str, str], together: int, model: str) -> float:
    """The slowest wall time of ``together`` copies of ``workload`` started at once."""
    command = [sys.executable, __file__, "--worker", workload, "--model", model]
    base = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    procs = [subprocess.Popen(command, env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(together)]
    walls = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{workload} under {env or 'default'} failed:\n{err[-3000:]}")
        walls.append(json.loads(out.strip().splitlines()[-1])["wall"])
    return max(walls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--policies", default="default,passive", help=f"comma list of {', '.join(POLICIES)}")
    parser.add_argument("--workloads", default="decode,update", help=f"comma list of {', '.join(WORKLOADS)}")
    parser.add_argument("--together", default="1,2", help="comma list: copies run at once")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model)
        return
    from rich.console import Console
    from rich.table import Table

    policies = [p for p in POLICIES if p in {"default", *args.policies.split(",")}]
    workloads = [w for w in WORKLOADS if w in args.workloads.split(",")]
    counts = [int(n) for n in args.together.split(",")]
    results: dict[tuple[str, int, str], list[float]] = {}
    load_before = os.getloadavg()[0]
    for workload in workloads:
        for together in counts:
            for _ in range(args.repeats):
                for policy in policies:
                    wall = measure(workload, POLICIES[policy], together, args.model)
                    results.setdefault((workload, together, policy), []).append(wall)
    load_after = os.getloadavg()[0]
    table = Table(title=f"OpenMP wait policy ({args.model}, median of {args.repeats}; load {load_before:.2f} -> "
                        f"{load_after:.2f}, {os.cpu_count()} cores)")
    for column in ("workload", "copies at once", "policy", "wall s (slowest copy)", "runs", "vs default"):
        table.add_column(column)
    for workload in workloads:
        for together in counts:
            base = statistics.median(results[(workload, together, "default")])
            for policy in policies:
                runs = results[(workload, together, policy)]
                wall = statistics.median(runs)
                table.add_row(workload, str(together), policy, f"{wall:.2f}", " ".join(f"{r:.1f}" for r in runs),
                              f"{base / wall:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
