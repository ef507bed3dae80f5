"""fp32 vs bf16 on this CPU, stage by stage: matmul, generation, log-prob pass, update; and the log-prob gap.

    .venv/bin/python bench/precision.py [--model smollm2-135m-instruct] [--rounds 2]

Why: the CPU backend's dtype (the dtype keys' ``auto`` in config/backend/cpu.yaml, docs/backends.md) is bf16
only where it pays (a bf16 flag and a probe's matrix product at >= 1.1x fp32; the title shows what ``auto``
picks here), and bf16 changes the numbers the update sees. Each stage runs in both dtypes inside this one
process, alternating (fp32, bf16, bf16, fp32, ...) so a drift of the machine's load falls on both; the best
round of each counts and the ratio column is fp32 seconds / bf16 seconds (>1: bf16 is faster).

The stages, at the quickstart's shapes (examples/quickstart.yaml: SmolLM2-135M, groups of 4 samples,
~490-token prompts, 64-token turns):

* ``matmul``: a 2048 x 2048 matrix product (GFLOP/s: the rate the step's floor is computed with);
* ``generate``: the CPU rollout server's generator (``HFGenerator``) with weights in the dtype, 16 prompts
  x 64 new tokens, sampled; tokens/s;
* ``log-prob``: a no-grad forward over 16 x ~560 tokens (the old / reference log-prob pass), fp32 weights,
  bf16 under autocast as verl's FSDP engine runs it;
* ``update``: forward + backward + AdamW over 4 x ~560 tokens (one micro-batch), fp32 master weights, bf16
  under autocast (FSDP2's mixed-precision policy computes in bf16 and keeps fp32 parameters the same way).

The gap table: per-token log-probs of the generated tokens as the rollout computed them (bf16 weights) and
as the trainer recomputes them (fp32 master weights under bf16 autocast), against the fp32 trainer's; the
mean and the largest absolute difference, and the share of tokens whose importance ratio leaves
[0.8, 1.25] (PPO's clip range at 0.2), which is what the update would clip for numeric reasons alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.backends.cpu.generator import HFGenerator  # noqa: E402
from agentevolver.backends.cpu.precision import bf16_speedup, cpu_bf16_support, resolve_dtype  # noqa: E402
from agentevolver.models import resolve_model_path  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def matmul_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 8) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # warm-up (oneDNN picks its kernel)
    seconds = timed(lambda: [a @ b for _ in range(repeats)])
    return 2 * size**3 * repeats / seconds / 1e9


def batch(vocab: int, rows: int, length: int, seed: int) -> torch.Tensor:
    rng = random.Random(seed)
    return torch.tensor([[rng.randrange(10, vocab) for _ in range(length)] for _ in range(rows)])


def autocast(dtype: torch.dtype):
    return torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)


def logprob_pass(model: torch.nn.Module, ids: torch.Tensor, dtype: torch.dtype) -> None:
    with torch.no_grad(), autocast(dtype):
        for row in range(0, len(ids), 8):  # log_prob_micro_batch_size_per_gpu: 8
            logits = model(input_ids=ids[row:row + 8]).logits.float()
            torch.log_softmax(logits, dim=-1)


def update(model: torch.nn.Module, optim: torch.optim.Optimizer, ids: torch.Tensor, dtype: torch.dtype) -> None:
    with autocast(dtype):
        logits = model(input_ids=ids).logits
    logp = torch.log_softmax(logits.float(), dim=-1)
    loss = -logp[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    loss.backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


async def generate(generator: HFGenerator, prompts: list[list[int]], tokens: int) -> int:
    outs = await asyncio.gather(*(generator.generate(f"p{i}", prompt_ids=p, sampling_params={
        "max_tokens": tokens, "temperature": 1.0}) for i, p in enumerate(prompts)))
    return sum(len(o.token_ids) for o in outs)


def token_logprobs(model: torch.nn.Module, ids: list[int], start: int, dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad(), autocast(dtype):
        logits = model(input_ids=torch.tensor([ids])).logits.float()[0]
    logp = torch.log_softmax(logits[start - 1:-1], dim=-1)
    return logp.gather(-1, torch.tensor(ids[start:])[:, None])[:, 0]


async def run(args: argparse.Namespace, console: Console) -> None:
    from transformers import AutoModelForCausalLM

    load_at_start = os.getloadavg()[0]
    path = resolve_model_path(args.model)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    vocab = model.config.vocab_size
    optim = torch.optim.AdamW(model.parameters(), lr=1e-7)
    generators = {name: HFGenerator.from_pretrained(path, dtype=str(dtype).removeprefix("torch."),
                                                    max_batch_size=16, seed=0)
                  for name, dtype in DTYPES.items()}
    prompts = batch(vocab, 16, 490, seed=1).tolist()
    lp_ids, up_ids = batch(vocab, 16, 560, seed=2), batch(vocab, 4, 560, seed=3)
    best: dict[tuple[str, str], float] = {}
    tokens: dict[str, int] = {}

    def keep(stage: str, name: str, seconds: float) -> None:
        best[stage, name] = min(seconds, best.get((stage, name), float("inf")))

    for name in DTYPES:  # warm-up: kernels, generator threads, optimiser state
        logprob_pass(model, lp_ids[:8], DTYPES[name])
        update(model, optim, up_ids[:1, :64], DTYPES[name])
        await generate(generators[name], prompts[:2], 4)
    for round_ in range(args.rounds):
        for name in (("fp32", "bf16") if round_ % 2 == 0 else ("bf16", "fp32")):
            dtype = DTYPES[name]
            keep("matmul", name, 1.0 / matmul_gflops(dtype))
            started = time.perf_counter()
            tokens[name] = await generate(generators[name], prompts, args.new_tokens)
            keep("generate", name, (time.perf_counter() - started) / tokens[name])
            keep("log-prob", name, timed(lambda d=dtype: logprob_pass(model, lp_ids, d)))
            keep("update", name, timed(lambda d=dtype: update(model, optim, up_ids, d)))

    probe = f", probe {bf16_speedup():.2f}x" if cpu_bf16_support() else ""
    table = Table(title=f"fp32 vs bf16, {args.model}; bf16 flag: {cpu_bf16_support() or 'none'}{probe}, auto -> "
                        f"{resolve_dtype('auto')}; load "
                        f"{load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end (this bench included); "
                        f"best of {args.rounds}")
    for column in ("stage", "fp32", "bf16", "fp32 / bf16"):
        table.add_column(column, justify="right")
    units = {"matmul": ("GFLOP/s", lambda s: f"{1 / s:.0f}"), "generate": ("tokens/s", lambda s: f"{1 / s:.0f}"),
             "log-prob": ("s", lambda s: f"{s:.2f}"), "update": ("s", lambda s: f"{s:.2f}")}
    for stage, (unit, show) in units.items():
        fp32, bf16 = best[stage, "fp32"], best[stage, "bf16"]
        table.add_row(f"{stage} ({unit})", show(fp32), show(bf16), f"{fp32 / bf16:.2f}x")
    console.print(table)

    # The gap: a sampled response from the bf16 generator, scored three ways.
    out = await generators["bf16"].generate("gap", prompt_ids=prompts[0], sampling_params={
        "max_tokens": args.new_tokens, "temperature": 1.0, "logprobs": True})
    ids, start = prompts[0] + list(out.token_ids), len(prompts[0])
    rollout = torch.tensor(out.log_probs, dtype=torch.float32)
    reference = token_logprobs(model, ids, start, torch.float32)
    trainer_bf16 = token_logprobs(model, ids, start, torch.bfloat16)
    gap = Table(title=f"log-prob gap on {len(rollout)} sampled tokens, against the fp32 trainer")
    for column in ("log-probs from", "mean |diff|", "max |diff|", "ratio outside [0.8, 1.25]"):
        gap.add_column(column, justify="right")
    for label, values, base in (("bf16 rollout vs fp32 trainer", rollout, reference),
                                ("bf16 trainer vs fp32 trainer", trainer_bf16, reference),
                                ("bf16 rollout vs bf16 trainer", rollout, trainer_bf16)):
        diff = (values - base).abs()
        ratio = (values - base).exp()
        outside = ((ratio < 0.8) | (ratio > 1.25)).float().mean().item()
        gap.add_row(label, f"{diff.mean():.4f}", f"{diff.max():.4f}", f"{outside:.1%}")
    console.print(gap)
    for generator in generators.values():
        await generator.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or model folder")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per dtype (alternating order)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt")
    args = parser.parse_args()
    asyncio.run(run(args, Console()))


if __name__ == "__main__":
    main()
