"""Time the ADCA-GRPO advantage stage (vectorised) against a naive per-sample loop of the same maths.

    .venv/bin/python bench/advantage.py [--batch 1024] [--length 8192] [--max-steps 30] [--repeats 3]
                                        [--threads 1] [--device cpu|cuda]

A synthetic batch shaped like the trainer's: ``--batch`` responses of ``--length`` tokens in GRPO groups of
8; each sample has 1..``--max-steps`` steps whose generated tokens alternate with observation tokens (step id
-1), then padding; binary outcomes; a GOOD/BAD label per step (about 10% of samples without labels, i.e. GRPO
fallback). Rows, all in this process on the same batch:

* naive per-sample loop: :func:`tools.adv_oracle.naive_prm_grpo_advantages` (Python
  lists per sample, dict group statistics, a per-sample masked assignment onto tokens; the reference's way);
* vectorised core: :func:`prm_grpo_advantages` on (B, L) step ids already in a tensor;
* vectorised from a DataProto with list step ids: :func:`compute_prm_grpo_advantages` reading step ids as the
  per-sample lists our agent loop puts in ``non_tensor_batch`` (includes padding them into a tensor);
* the same with ragged per-sample ``np.int32`` arrays;
* the same with per-sample ``np.int32`` rows already padded to the response width: what our agent loop hands
  over (:func:`agentevolver.verl.agent_loop.padded_step_ids`, built in the agent-loop worker per episode), so
  this row is the stage as the trainer runs it.

Both results are checked equal before timing. Times are the best of ``--repeats`` runs. ``--threads`` is
torch's intra-op thread count; the default 1 is what the stage gets in the trainer, whose driver is a Ray actor
(Ray starts actors with ``OMP_NUM_THREADS=1`` unless it is set); 0 keeps torch's default.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from verl import DataProto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the oracle lives in tools/, outside the installed package

from agentevolver.module.adv_processor import (  # noqa: E402
    AdcaHyper,
    compute_prm_grpo_advantages,
    prm_grpo_advantages,
)
from agentevolver.module.adv_processor.adca_grpo import num_steps, pack_step_flags  # noqa: E402
from agentevolver.verl.agent_loop import padded_step_ids  # noqa: E402
from tools.adv_oracle import naive_prm_grpo_advantages  # noqa: E402

GROUP = 8


def synthetic_batch(batch: int, length: int, max_steps: int, seed: int) -> dict[str, Any]:
    """Step ids, outcomes, groups and labels of a trainer-like batch (see the module docstring)."""
    rng = random.Random(seed)
    rows: list[list[int]] = []
    flags: list[list[bool] | None] = []
    for _ in range(batch):
        steps = rng.randint(1, max_steps)
        used = rng.randint(length // 2, length)  # the rest is padding
        per_step = max(used // steps, 2)
        ids: list[int] = []
        for step in range(steps):
            generated = rng.randint(1, per_step - 1)
            ids += [step] * generated + [-1] * (per_step - generated)
        rows.append(ids[:length])
        count = max(ids[:length]) + 1
        flags.append(None if rng.random() < 0.1 else [rng.random() < 0.5 for _ in range(count)])
    step_ids = torch.full((batch, length), -1, dtype=torch.long)
    for i, ids in enumerate(rows):
        step_ids[i, : len(ids)] = torch.tensor(ids)
    outcomes = [float(rng.random() < 0.4) for _ in range(batch)]
    groups = [i // GROUP for i in range(batch)]
    return {"rows": rows, "step_ids": step_ids, "outcomes": outcomes, "groups": groups, "flags": flags}


def best_of(repeats: int, run: Callable[[], Any], sync: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        sync()
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0 = torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    data = synthetic_batch(args.batch, args.length, args.max_steps, args.seed)
    step_ids = data["step_ids"].to(device)
    mask = (step_ids >= 0).long()
    outcomes = torch.tensor(data["outcomes"], device=device)
    groups = torch.tensor(data["groups"], device=device)
    rewards = torch.zeros(args.batch, args.length, device=device)
    rewards[:, -1] = outcomes
    fallback = torch.zeros(args.batch, args.length, device=device)
    hyper = AdcaHyper(alpha=0.1)
    column = np.empty(args.batch, dtype=object)
    column[:] = data["rows"]
    uid = np.array([str(g) for g in data["groups"]], dtype=object)
    tensors = {"response_mask": mask, "token_level_rewards": rewards, "advantages": fallback}
    proto = DataProto.from_dict(tensors=dict(tensors), non_tensors={"uid": uid, "step_ids": column})
    arrays = np.empty(args.batch, dtype=object)
    arrays[:] = [np.asarray(row, dtype=np.int32) for row in data["rows"]]
    proto_arrays = DataProto.from_dict(tensors=dict(tensors), non_tensors={"uid": uid.copy(), "step_ids": arrays})
    padded = np.empty(args.batch, dtype=object)
    padded[:] = [padded_step_ids(row, args.length) for row in data["rows"]]
    proto_padded = DataProto.from_dict(tensors=dict(tensors), non_tensors={"uid": uid.copy(), "step_ids": padded})

    def naive() -> torch.Tensor:
        return naive_prm_grpo_advantages(step_ids.cpu(), mask.cpu(), data["outcomes"], data["groups"], data["flags"],
                                         fallback.cpu(), hyper)

    def core() -> torch.Tensor:
        steps = num_steps(step_ids)
        packed, labelled = pack_step_flags(data["flags"], steps)
        return prm_grpo_advantages(step_ids, mask, outcomes, groups, packed, labelled, fallback, hyper,
                                   steps=steps).advantages

    def from_proto() -> torch.Tensor:
        return compute_prm_grpo_advantages(proto, data["flags"], hyper).advantages

    def from_proto_arrays() -> torch.Tensor:
        return compute_prm_grpo_advantages(proto_arrays, data["flags"], hyper).advantages

    def from_proto_padded() -> torch.Tensor:
        return compute_prm_grpo_advantages(proto_padded, data["flags"], hyper).advantages

    expected = naive()
    for candidate in (core(), from_proto(), from_proto_arrays(), from_proto_padded()):
        diff = (candidate.cpu() - expected).abs().max().item()
        if diff > 1e-4:
            raise SystemExit(f"vectorised and naive results differ by {diff}")

    rows = [("naive per-sample loop (baseline)", best_of(args.repeats, naive, sync)),
            ("vectorised core, step ids as a (B, L) tensor", best_of(args.repeats, core, sync)),
            ("vectorised from a DataProto, step ids as lists", best_of(args.repeats, from_proto, sync)),
            ("vectorised from a DataProto, step ids as ragged arrays", best_of(args.repeats, from_proto_arrays, sync)),
            ("vectorised from a DataProto, step ids as padded rows (our agent loop)",
             best_of(args.repeats, from_proto_padded, sync))]
    baseline = rows[0][1]
    steps = num_steps(data["step_ids"]).double().mean().item()
    table = Table(title=f"ADCA-GRPO advantages: batch {args.batch} x {args.length} tokens, "
                        f"{steps:.1f} steps/sample on average, {device.type}, {torch.get_num_threads()} thread(s), "
                        f"best of {args.repeats}")
    table.add_column("method")
    table.add_column("time (ms)", justify="right")
    table.add_column("vs naive", justify="right")
    for name, seconds in rows:
        table.add_row(name, f"{seconds * 1000:.1f}", f"{baseline / seconds:.1f}x faster" if seconds != baseline
                      else "1.0x")
    Console().print(table)


if __name__ == "__main__":
    main()
