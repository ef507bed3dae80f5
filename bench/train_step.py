"""Update throughput: tokens/s of the actor update with and without padding removal.

    .venv/bin/python bench/train_step.py [--model smollm2-135m-instruct] [--samples 16] [--micro-batch 4]
                                         [--dump rollouts/step_1.jsonl] [--repeats 2]

The update is forward + backward + optimiser step over a batch of episodes whose lengths vary a lot (a
multi-turn episode ends after 1 turn or after many). verl feeds the model one of two layouts, chosen by
``actor_rollout_ref.model.use_remove_padding``:

* ``padded`` (false): each micro-batch is a (B, L) tensor right-padded to its longest sample, with an
  attention mask; the padding positions cost as much as real tokens in every matmul;
* ``packed`` (true): the micro-batch's samples are concatenated into one (1, total) row, padding removed;
  ``position_ids`` restart at 0 for each sample and transformers (>= 5, sdpa) turns those restarts into a
  block-diagonal causal mask, so samples do not attend to each other. On GPU verl uses flash-attention's
  variable-length kernel for the same layout.

This benchmark builds both layouts from the same samples (lengths from a rollout dump, or drawn like the
quickstart's: a ~480-token prompt and a 40-256-token response), runs the same number of update steps with
each on the real model in this process, and prints tokens/s (real tokens only) and the ratio against the
padded baseline. It first checks that both layouts give the same per-token log-probs (max abs difference
printed), i.e. that packing changes the cost and not the result.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.models import resolve_model_path  # noqa: E402


@dataclass
class Sample:
    """One episode as the actor sees it: prompt + response ids, which response tokens are trained."""

    prompt: list[int]
    response: list[int]

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.response


def samples_from_dump(path: Path, limit: int) -> list[Sample]:
    samples = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        samples.append(Sample(list(record["prompt_ids"]), list(record["response_ids"])))
        if len(samples) == limit:
            break
    return samples


def synthetic_samples(count: int, vocab: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(450, 510))]
        response = [rng.randrange(10, vocab) for _ in range(rng.randint(40, 256))]
        out.append(Sample(prompt, response))
    return out


def padded_inputs(batch: list[Sample]) -> dict[str, torch.Tensor]:
    """verl's use_remove_padding=false layout: (B, L) right-padded to the micro-batch's longest sample."""
    longest = max(len(s.ids) for s in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros(len(batch), longest, dtype=torch.long)
    for row, sample in enumerate(batch):
        ids[row, : len(sample.ids)] = torch.tensor(sample.ids)
        mask[row, : len(sample.ids)] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def packed_inputs(batch: list[Sample]) -> dict[str, torch.Tensor]:
    """verl's use_remove_padding=true layout: one (1, total) row, positions restarting per sample."""
    ids = torch.tensor([t for s in batch for t in s.ids]).unsqueeze(0)
    positions = torch.cat([torch.arange(len(s.ids)) for s in batch]).unsqueeze(0)
    return {"input_ids": ids, "position_ids": positions}


def response_logprobs(model: torch.nn.Module, batch: list[Sample], packed: bool) -> list[torch.Tensor]:
    """Log-prob of each response token given everything before it, per sample."""
    inputs = packed_inputs(batch) if packed else padded_inputs(batch)
    logits = model(**inputs, use_cache=False).logits.float()
    out = []
    offset = 0
    for row, sample in enumerate(batch):
        start = len(sample.prompt)
        end = len(sample.ids)
        if packed:
            seq_logits, seq_ids = logits[0, offset: offset + end], inputs["input_ids"][0, offset: offset + end]
            offset += end
        else:
            seq_logits, seq_ids = logits[row, :end], inputs["input_ids"][row, :end]
        logp = torch.log_softmax(seq_logits[start - 1: end - 1], dim=-1)
        out.append(logp.gather(-1, seq_ids[start:end].unsqueeze(-1)).squeeze(-1))
    return out


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, samples: list[Sample], micro: int,
           packed: bool, advantages: list[float]) -> None:
    """One update over ``samples``: policy-gradient token-mean loss, micro-batched, then the optimiser step."""
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(len(s.response) for s in samples)
    for start in range(0, len(samples), micro):
        batch = samples[start: start + micro]
        logps = response_logprobs(model, batch, packed)
        loss = -sum((lp * advantages[start + i]).sum() for i, lp in enumerate(logps)) / tokens
        loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--samples", type=int, default=16, help="episodes per update")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="timed updates per layout")
    parser.add_argument("--dump", type=Path, default=None, help="take sample lengths (and ids) from this dump")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model_path(args.model)), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    samples = (samples_from_dump(args.dump, args.samples) if args.dump
               else synthetic_samples(args.samples, model.config.vocab_size, args.seed))
    rng = random.Random(args.seed)
    advantages = [rng.choice([-1.0, 1.0]) for _ in samples]
    real = sum(len(s.ids) for s in samples)
    padded_total = sum(max(len(s.ids) for s in samples[i: i + args.micro_batch]) * len(samples[i: i + args.micro_batch])
                       for i in range(0, len(samples), args.micro_batch))

    model.eval()
    with torch.no_grad():
        first = samples[: args.micro_batch]
        diff = max((a - b).abs().max().item() for a, b in zip(response_logprobs(model, first, False),
                                                             response_logprobs(model, first, True), strict=True))
    model.train()

    results = {}
    for name, packed in (("padded", False), ("packed", True)):
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: same weights for both layouts
        update(model, optimizer, samples, args.micro_batch, packed, advantages)  # warm-up (allocations)
        started = time.perf_counter()
        for _ in range(args.repeats):
            update(model, optimizer, samples, args.micro_batch, packed, advantages)
        results[name] = (time.perf_counter() - started) / args.repeats

    table = Table(title=f"actor update, {args.model}, {len(samples)} samples, micro-batch {args.micro_batch}, "
                        f"{torch.get_num_threads()} threads")
    for column in ("layout", "tokens computed", "real tokens", "s / update", "real tokens / s", "vs padded"):
        table.add_column(column, justify="right")
    base = real / results["padded"]
    for name, computed in (("padded", padded_total), ("packed", real)):
        speed = real / results[name]
        table.add_row(name, str(computed), str(real), f"{results[name]:.1f}", f"{speed:.0f}", f"{speed / base:.2f}x")
    console = Console()
    console.print(table)
    console.print(f"max |log-prob difference| padded vs packed: {diff:.2e}")


if __name__ == "__main__":
    main()
