"""Update throughput: tokens/s of the actor update unshared (padded, packed) vs shared prompts.

    .venv/bin/python bench/train_step.py [--shapes quickstart long] [--repeats 1]
                                         [--dump rollouts/step_1.jsonl] [--groups N]

The update is forward + backward + optimiser step over a batch of GRPO groups: ``rollout.n`` samples share
one prompt and differ in their responses. The layouts:

* ``padded`` (``use_remove_padding: false``, the CPU and GPU presets): each micro-batch is a (B, L) tensor
  right-padded to its longest sample; every sample carries its own copy of the prompt;
* ``packed`` (``use_remove_padding: true``): the micro-batch's samples concatenated into one (1, total) row,
  positions restarting per sample (transformers turns the restarts into a block-diagonal mask); still one
  prompt copy per sample;
* ``shared`` (``agentevolver.verl.shared_prefix``): one row per group, the prompt once and each response
  after it, a block mask so that every response attends to the one prompt copy and not to the other
  responses. Each group's prompt is computed (forward and backward) once, and the LM head skips the prompt
  positions, whose logits no loss reads;
* ``shared+prompt-logits``: the same with the LM head over every position, as the unshared layouts run it
  (separates the gain of sharing from that of skipping the prompt's logits).

Shapes (``--shapes``):

* ``quickstart``: SmolLM2-135M, 4 groups of n = 4 (16 samples: one mini-batch, i.e. one optimiser step, of
  ``examples/quickstart.yaml``), ~490-token prompts (450-510), 70-130-token responses, micro-batches of 4
  samples (one group);
* ``long``: tiny-test, groups of n = 8, ~4k-token prompts (3968-4032), 70-130-token responses (AppWorld-like
  prompts); unshared micro-batches of 1 sample (a (8, 4k) padded micro-batch holds ~7 GB of fp32 logits;
  on CPU the per-token cost hardly depends on the micro-batch size), shared micro-batches of one group.

Throughput counts the samples' tokens (prompt + response per sample, what the unshared update trains on) per
second, so the ratio of two layouts is the ratio of their update times; "tokens computed" is what each layout
actually runs through the model. Time is measured twice: CPU time of this process (``time.process_time``,
all its threads) and wall time. On a machine shared with other jobs the wall time of one update swings with
the load (several-fold on 2 cores), the CPU time far less, so the ratio column uses CPU time; the layouts
alternate inside one process and the best of ``--repeats`` updates counts. Each shape first checks that the
layouts give the same per-token log-probs (max abs difference printed); the load average is printed with
each table.
"""

from __future__ import annotations

import argparse
import json
import os
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
from agentevolver.verl.shared_prefix import plan_groups, shared_forward, unshared_forward  # noqa: E402


@dataclass
class Sample:
    """One episode as the actor sees it: prompt + response ids, and its GRPO group."""

    prompt: list[int]
    response: list[int]
    group: int = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.response


@dataclass(frozen=True)
class Shape:
    model: str
    group_size: int
    groups: int
    prompt: tuple[int, int]
    response: tuple[int, int]
    micro_batch: int  # samples per micro-batch of the unshared layouts
    layouts: tuple[str, ...]


SHAPES = {
    "quickstart": Shape("smollm2-135m-instruct", 4, 4, (450, 510), (70, 130), 4,
                        ("padded", "packed", "shared", "shared+prompt-logits")),
    "long": Shape("tiny-test", 8, 1, (3968, 4032), (70, 130), 1, ("padded", "shared", "shared+prompt-logits")),
}


def samples_from_dump(path: Path, limit: int) -> list[Sample]:
    """The first ``limit`` samples of a rollout dump, grouped by identical prompt ids."""
    samples, groups = [], {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        prompt = list(record["prompt_ids"])
        group = groups.setdefault(tuple(prompt), len(groups))
        samples.append(Sample(prompt, list(record["response_ids"]), group))
        if len(samples) == limit:
            break
    return sorted(samples, key=lambda s: s.group)


def synthetic_groups(shape: Shape, groups: int, vocab: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for group in range(groups):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(*shape.prompt))]
        for _ in range(shape.group_size):
            response = [rng.randrange(10, vocab) for _ in range(rng.randint(*shape.response))]
            out.append(Sample(prompt, response, group))
    return out


def micro_batches(samples: list[Sample], layout: str, micro: int) -> list[list[Sample]]:
    """Fixed-size micro-batches for the unshared layouts; one whole group per micro-batch for ``shared``."""
    if layout.startswith("shared"):
        by_group: dict[int, list[Sample]] = {}
        for sample in samples:
            by_group.setdefault(sample.group, []).append(sample)
        return list(by_group.values())
    return [samples[i: i + micro] for i in range(0, len(samples), micro)]


def packed_logprobs(model: torch.nn.Module, batch: list[Sample]) -> torch.Tensor:
    """verl's use_remove_padding=true layout: one (1, total) row, positions restarting per sample."""
    ids = torch.tensor([t for s in batch for t in s.ids]).unsqueeze(0)
    positions = torch.cat([torch.arange(len(s.ids)) for s in batch]).unsqueeze(0)
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits.float()
    width = max(len(s.response) for s in batch)
    out = torch.zeros(len(batch), width)
    offset = 0
    for row, sample in enumerate(batch):
        start, end = len(sample.prompt), len(sample.ids)
        seq_logits, seq_ids = logits[0, offset: offset + end], ids[0, offset: offset + end]
        offset += end
        logp = torch.log_softmax(seq_logits[start - 1: end - 1], dim=-1)
        out[row, : end - start] = logp.gather(-1, seq_ids[start:end].unsqueeze(-1)).squeeze(-1)
    return out


def response_logprobs(model: torch.nn.Module, batch: list[Sample], layout: str) -> torch.Tensor:
    """(B, R) log-prob of each response token given everything before it, in ``layout``."""
    if layout == "packed":
        return packed_logprobs(model, batch)
    sequences = [torch.tensor(s.ids) for s in batch]
    prompt_lens = [len(s.prompt) for s in batch]
    if layout == "padded":
        return unshared_forward(model, sequences, prompt_lens)[0]
    plan = plan_groups(sequences, prompt_lens, group_keys=[s.group for s in batch])
    return shared_forward(model, plan, prompt_logits=layout == "shared+prompt-logits")[0]


def tokens_computed(samples: list[Sample], layout: str, micro: int) -> int:
    total = 0
    for batch in micro_batches(samples, layout, micro):
        if layout == "padded":
            total += max(len(s.ids) for s in batch) * len(batch)
        elif layout == "packed":
            total += sum(len(s.ids) for s in batch)
        else:
            total += plan_groups([torch.tensor(s.ids) for s in batch], [len(s.prompt) for s in batch]).tokens
    return total


def update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, samples: list[Sample], micro: int,
           layout: str, advantages: dict[int, float]) -> None:
    """One update over ``samples``: policy-gradient token-mean loss, micro-batched, then the optimiser step."""
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(len(s.response) for s in samples)
    for batch in micro_batches(samples, layout, micro):
        logps = response_logprobs(model, batch, layout)
        weights = torch.tensor([advantages[id(s)] for s in batch]).unsqueeze(1)
        loss = -(logps * weights).sum() / tokens
        loss.backward()
    optimizer.step()


def load_text() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def bench_shape(name: str, shape: Shape, args: argparse.Namespace, console: Console) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model_path(shape.model)), dtype=torch.float32,
                                                 attn_implementation="sdpa")
    groups = args.groups or shape.groups
    samples = (samples_from_dump(args.dump, groups * shape.group_size) if args.dump and name == "quickstart"
               else synthetic_groups(shape, groups, model.config.vocab_size, args.seed))
    rng = random.Random(args.seed)
    advantages = {id(s): rng.choice([-1.0, 1.0]) for s in samples}
    sample_tokens = sum(len(s.ids) for s in samples)
    load_before = load_text()

    model.eval()
    with torch.no_grad():  # the first group, each layout with its own micro-batches, against padded
        first = micro_batches(samples, "shared", shape.micro_batch)[0]
        logprobs = {layout: [row[: len(s.response)] for batch in micro_batches(first, layout, shape.micro_batch)
                             for s, row in zip(batch, response_logprobs(model, batch, layout), strict=True)]
                    for layout in shape.layouts}
        diffs = {layout: max((a - b).abs().max().item() for a, b in zip(rows, logprobs["padded"], strict=True))
                 for layout, rows in logprobs.items() if layout != "padded"}
    model.train()

    results = {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: same weights for every layout
    for layout in shape.layouts:  # warm-up: one micro-batch each (allocator, kernels)
        optimizer.zero_grad(set_to_none=True)
        response_logprobs(model, micro_batches(samples, layout, shape.micro_batch)[0], layout).sum().backward()
    for _ in range(args.repeats):  # layouts alternate so that a change of load hits all of them
        for layout in shape.layouts:
            cpu, wall = time.process_time(), time.perf_counter()
            update(model, optimizer, samples, shape.micro_batch, layout, advantages)
            results.setdefault(layout, []).append((time.process_time() - cpu, time.perf_counter() - wall))

    prompts = sorted({len(s.prompt) for s in samples})
    responses = [len(s.response) for s in samples]
    table = Table(title=f"{name}: actor update, {shape.model}, {groups} groups x n = {shape.group_size} "
                        f"({len(samples)} samples), prompts {prompts[0]}-{prompts[-1]} tokens, responses "
                        f"{min(responses)}-{max(responses)}, {torch.get_num_threads()} threads")
    for column in ("layout", "micro-batch", "tokens computed", "sample tokens", "CPU s / update",
                   "sample tokens / CPU s", "vs padded (CPU)", "wall s / update", "vs padded (wall)"):
        table.add_column(column, justify="right")
    cpu = {layout: min(c for c, _ in times) for layout, times in results.items()}
    wall = {layout: min(w for _, w in times) for layout, times in results.items()}
    for layout in shape.layouts:
        micro = f"1 group ({shape.group_size})" if layout.startswith("shared") else str(shape.micro_batch)
        table.add_row(layout, micro, str(tokens_computed(samples, layout, shape.micro_batch)), str(sample_tokens),
                      f"{cpu[layout]:.1f}", f"{sample_tokens / cpu[layout]:.0f}", f"{cpu['padded'] / cpu[layout]:.2f}x",
                      f"{wall[layout]:.1f}", f"{wall['padded'] / wall[layout]:.2f}x")
    console.print(table)
    for layout, diff in diffs.items():
        console.print(f"max |log-prob difference| {layout} vs padded: {diff:.2e}")
    console.print(f"{load_before} before, {load_text()} after; best of {args.repeats} update(s) per layout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["quickstart", "long"])
    parser.add_argument("--groups", type=int, default=0, help="GRPO groups per update (0: the shape's default)")
    parser.add_argument("--repeats", type=int, default=1, help="timed updates per layout (best is reported)")
    parser.add_argument("--dump", type=Path, default=None,
                        help="quickstart shape: take samples (ids, grouped by prompt) from this rollout dump")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    console = Console(width=160)
    for name in args.shapes:
        bench_shape(name, SHAPES[name], args, console)


if __name__ == "__main__":
    main()
