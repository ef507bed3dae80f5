"""How much prompt-lookup drafting could speed up decoding: recorded episodes replayed, and a verifying pass priced.

    .venv/bin/python bench/prompt_lookup.py checkpoints/agentevolver/quickstart/rollouts/step_*.jsonl
    .venv/bin/python bench/prompt_lookup.py ablations/self_evolution/runs/q_a/seed0/rollouts/step_*.jsonl --rows 10

Why (issue 44): the CPU generator's decode step is bound by reading the weights, so a forward pass that checks a
row's next ``k`` drafted tokens at once costs little more than one that generates one token. Two numbers decide
whether speculative decoding with prompt-lookup drafts (agentevolver/backends/cpu/prompt_lookup.py) is worth
building into the generator:

* **tokens per verifying pass**, from the episodes a run recorded (its ``rollouts/`` dumps: prompt and response
  token ids, the response mask telling generated tokens from the environment's): each generated stretch is
  replayed draft by draft; a pass yields the drafted tokens that match what the policy generated, up to the first
  mismatch, plus the one token the pass itself produces. For sampled episodes a match is one draw of the
  acceptance test (speculative sampling accepts a draft token with the probability the policy gives it, which is
  the chance that the policy's own draw equals it), so the mean is the expected yield;
* **what a pass costs**, from the model's own linear layers: one pass over all of them with ``rows`` rows (a
  decode step) against ``rows x (k + 1)`` rows (a verifying pass), alternating in this process. Attention, the
  sampler and Python are left out, so "estimated speed-up" (tokens per pass / cost ratio) is an upper bound
  for the decode steps, not a measurement of a generator that does this.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.backends.cpu.prompt_lookup import PromptLookup  # noqa: E402


def replay(episodes: list[dict[str, Any]], k: int, ngram_sizes: tuple[int, ...]) -> tuple[int, int]:
    """(generated tokens, verifying passes) over ``episodes`` with drafts of up to ``k`` tokens."""
    tokens = passes = 0
    for episode in episodes:
        lookup = PromptLookup(episode["prompt_ids"], ngram_sizes)
        response, mask = episode["response_ids"], episode["response_mask"]
        index = 0
        while index < len(response):
            if not mask[index]:  # the environment's tokens: context, not generated
                lookup.extend([response[index]])
                index += 1
                continue
            draft = lookup.propose(k)
            matched = 0
            while (matched < len(draft) and index + matched < len(response) and mask[index + matched]
                   and response[index + matched] == draft[matched]):
                matched += 1
            # the pass's own token follows the matched drafts while the stretch goes on
            step = matched + 1 if index + matched < len(response) and mask[index + matched] else matched
            lookup.extend(response[index:index + step])
            index += step
            tokens += step
            passes += 1
    return tokens, passes


def linear_pass_ms(model: Any, rows: int, repeats: int) -> float:
    """Milliseconds for one pass over every linear layer of ``model`` with ``rows`` rows (best of ``repeats``)."""
    import torch

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {layer.in_features: torch.randn(rows, layer.in_features, dtype=layer.weight.dtype) for layer in layers}
    best = float("inf")
    with torch.inference_mode():
        for layer in layers:  # warm-up: kernels for these shapes
            torch.nn.functional.linear(inputs[layer.in_features], layer.weight)
        for _ in range(repeats):
            started = time.perf_counter()
            for layer in layers:
                torch.nn.functional.linear(inputs[layer.in_features], layer.weight)
            best = min(best, time.perf_counter() - started)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dumps", nargs="+", help="rollout dump files (a run's rollouts/step_*.jsonl; globs work)")
    parser.add_argument("--draft", type=int, nargs="+", default=[4, 6, 8], help="draft lengths k to replay")
    parser.add_argument("--ngram", type=int, nargs="+", default=[3, 2], help="n-gram sizes, longest tried first")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model whose linear layers are timed")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, default=10, help="rows of a decode step (the quickstart: ~7-12)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per size (best counts)")
    args = parser.parse_args()

    files = sorted({path for pattern in args.dumps for path in (glob.glob(pattern) or [pattern])})
    missing = [path for path in files if not Path(path).is_file()]
    if missing:
        raise SystemExit(f"no such dump file: {missing[0]} (give a run's rollouts/step_*.jsonl)")
    episodes = [json.loads(line) for path in files for line in Path(path).read_text().splitlines() if line.strip()]
    if not episodes:
        raise SystemExit("the dump files hold no episodes")

    import torch
    from transformers import AutoModelForCausalLM

    from agentevolver.models import resolve_model_path

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(args.model),
                                                 dtype=getattr(torch, args.dtype)).eval()
    step_ms = statistics.median(linear_pass_ms(model, args.rows, args.repeats) for _ in range(3))
    console = Console(width=160)
    table = Table(title=f"prompt-lookup drafting over {len(episodes)} recorded episodes ({len(files)} files), "
                        f"n-grams {tuple(args.ngram)}; {args.model} {args.dtype}, a decode step of {args.rows} rows: "
                        f"{step_ms:.1f} ms of linear layers")
    for column in ("draft k", "generated tokens", "verifying passes", "tokens / pass", "pass cost vs a decode step",
                   "estimated speed-up (upper bound)"):
        table.add_column(column, justify="right")
    for k in args.draft:
        tokens, passes = replay(episodes, k, tuple(args.ngram))
        verify_ms = statistics.median(linear_pass_ms(model, args.rows * (k + 1), args.repeats) for _ in range(3))
        cost = verify_ms / step_ms
        table.add_row(str(k), str(tokens), str(passes), f"{tokens / passes:.2f}", f"{cost:.2f}x",
                      f"{tokens / passes / cost:.2f}x")
    console.print(table)
    load = os.getloadavg()
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
