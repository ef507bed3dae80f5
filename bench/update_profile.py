"""Where the actor update's time goes on CPU, against its floor: one GRPO group, shared prompt, bf16 autocast.

    .venv/bin/python bench/update_profile.py [--model smollm2-135m-instruct] [--dtype bf16|fp32] [--top 15]

Why: issue 30 asks for a step within 2x of its floor, the matmul rate times the model's 6 * N * tokens
FLOPs. This runs the quickstart's update unit the way the actor does: one GRPO group of 4 samples (a
490-token prompt computed once, 110-token responses), forward with entropy, backward, under bf16 autocast
over fp32 weights (or fp32). It prints:
- the measured seconds;
- the floor, 6 * N * (tokens computed) at the 2048 x 2048 matmul rate measured in the same process;
- their ratio;
- torch's profiler table of the operators that took the time (self CPU time).
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--top", type=int, default=15, help="operators shown")
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    load_at_start = os.getloadavg()[0]
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    rng = random.Random(0)
    prompt = [rng.randrange(10, model.config.vocab_size) for _ in range(490)]
    sequences = [torch.tensor(prompt + [rng.randrange(10, model.config.vocab_size) for _ in range(110)])
                 for _ in range(4)]
    plan = plan_groups(sequences, [len(prompt)] * 4, group_keys=[0] * 4)

    def update() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            log_probs, _ = shared_forward(model, plan, calculate_entropy=True)
        (-log_probs.mean()).backward()
        model.zero_grad(set_to_none=True)

    update()  # warm-up
    started = time.perf_counter()
    update()
    seconds = time.perf_counter() - started
    params = sum(p.numel() for p in model.parameters())
    rate = matmul_rate(dtype)
    floor = 6 * params * plan.tokens / rate
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        update()
    print(f"{args.model}, {args.dtype}, one group of 4 (tokens computed {plan.tokens}); load {load_at_start:.2f} at "
          f"the start, {os.getloadavg()[0]:.2f} at the end (this bench included)")
    print(f"update {seconds:.2f} s; floor 6 x {params / 1e6:.0f}M x {plan.tokens} tokens at {rate / 1e9:.0f} GFLOP/s "
          f"= {floor:.2f} s; update / floor = {seconds / floor:.1f}x")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top))


if __name__ == "__main__":
    main()
