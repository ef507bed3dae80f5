"""Where the actor update's time goes on CPU, against its floor: one GRPO group, shared prompt, bf16 autocast.

    .venv/bin/python bench/update_profile.py [--model smollm2-135m-instruct] [--dtype bf16|fp32] [--groups 4]

Why: issue 44 asks for an update within 6x of its floor, the matmul rate times the model's 6 * N * tokens
FLOPs. This runs the quickstart's update the way the actor does: 4 GRPO groups of 4 samples (490-token
prompts computed once per group, 70-130-token responses), forward with entropy, backward, under bf16
autocast over fp32 weights (or fp32), in three variants, alternating, in one process:
- as verl runs it by default: gradient checkpointing on (every layer's forward computed again in the
  backward), one group per micro-batch (``ppo_micro_batch_size_per_gpu: 4``);
- without gradient checkpointing;
- without it and with every group in one micro-batch.
It prints a table (seconds, ratio to the first variant, ratio to the floor: 6 * N * (tokens computed) at
the 2048 x 2048 matmul rate measured in the same process) and torch's profiler table of the fastest
variant's operators (self CPU time). It leaves out verl's FSDP wrapper, the optimiser and data movement.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.models import resolve_model_path  # noqa: E402
from agentevolver.verl.shared_prefix import plan_groups, shared_forward  # noqa: E402


def matmul_rate(dtype: torch.dtype, size: int = 2048, repeats: int = 8) -> float:
    """FLOP/s of a square matrix product in ``dtype``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups of 4 in one update (the quickstart's 4)")
    parser.add_argument("--rounds", type=int, default=2, help="timed updates per variant, alternating (best counts)")
    parser.add_argument("--top", type=int, default=15, help="operators shown for the fastest variant (0: no profile)")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the best seconds per variant and the floor here (bench/mkl_cpu.py reads it)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    load_at_start = os.getloadavg()[0]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    model.config.use_cache = False
    rng = random.Random(0)
    plans = []
    for _ in range(args.groups):
        prompt = [rng.randrange(10, model.config.vocab_size) for _ in range(490)]
        sequences = [torch.tensor(prompt + [rng.randrange(10, model.config.vocab_size)
                                            for _ in range(rng.randrange(70, 131))]) for _ in range(4)]
        plans.append((sequences, [len(prompt)] * 4))

    def micro_plans(groups_per_micro: int) -> list:
        chunks = [plans[i:i + groups_per_micro] for i in range(0, len(plans), groups_per_micro)]
        return [plan_groups([s for seqs, _ in chunk for s in seqs], [n for _, lens in chunk for n in lens],
                            group_keys=[g for g in range(len(chunk)) for _ in range(4)]) for chunk in chunks]

    def update(checkpointing: bool, groups_per_micro: int) -> float:
        """One optimiser step's forward and backward over every group; seconds."""
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_disable()
        model.train()
        micro = micro_plans(groups_per_micro)
        started = time.perf_counter()
        for plan in micro:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                log_probs, _ = shared_forward(model, plan, calculate_entropy=True)
            (-log_probs.mean() / len(micro)).backward()
        seconds = time.perf_counter() - started
        model.zero_grad(set_to_none=True)
        return seconds

    variants = {  # name -> (gradient checkpointing, groups per micro-batch)
        "as verl runs it: checkpointing, 1 group / micro-batch": (True, 1),
        "no checkpointing, 1 group / micro-batch": (False, 1),
        f"no checkpointing, {args.groups} groups / micro-batch": (False, args.groups),
    }
    for setting in variants.values():  # warm-up
        update(*setting)
    best = {name: float("inf") for name in variants}
    for index in range(args.rounds):
        for name in (list(variants) if index % 2 == 0 else list(variants)[::-1]):
            best[name] = min(best[name], update(*variants[name]))
    tokens = sum(micro.tokens for micro in micro_plans(args.groups))
    params = sum(p.numel() for p in model.parameters())
    rate = matmul_rate(dtype)
    floor = 6 * params * tokens / rate
    table = Table(title=f"actor update: {args.model}, {args.dtype}, {args.groups} groups of 4 ({tokens} tokens "
                        f"computed); floor 6 x {params / 1e6:.0f}M x {tokens} at {rate / 1e9:.0f} GFLOP/s = "
                        f"{floor:.2f} s; load {load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    for column in ("variant", "s / update", "vs verl's", "vs floor"):
        table.add_column(column, justify="right")
    baseline = best[next(iter(variants))]
    for name, seconds in best.items():
        table.add_row(name, f"{seconds:.2f}", f"{baseline / seconds:.2f}x", f"{seconds / floor:.1f}x")
    Console(width=200).print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"seconds": best, "floor": floor, "tokens": tokens, "rate": rate}))
    if args.top <= 0:
        return
    fastest = min(best, key=best.get)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update(*variants[fastest])
    print(f"operators of: {fastest}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
