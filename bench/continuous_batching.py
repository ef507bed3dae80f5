"""Continuous batching on vs off, against pure generation: the quickstart's episodes through the real agent flow.

    .venv/bin/python bench/continuous_batching.py                 # the quickstart's training episodes
    .venv/bin/python bench/continuous_batching.py --preset quickstart_hard --split val --tasks 102 --rollouts 1 \\
        --greedy                                                  # a hard-level validation round

Why: before continuous batching the CPU generator decoded one closed batch at a time. A row whose turn ended
waited for the batch's longest row, and the next turn of its episode started a new, small batch. This runs
what a rollout runs (the preset's model, agent flow, budgets and sampling; ``--rollouts`` episodes per task,
all in flight, against a real env service) with two generators in one process, ``continuous_batching=False``
(the closed batches of before) and ``True``. Rounds alternate (closed, continuous, continuous, closed, ...)
so a drift of the machine's load falls on both; the best round of each counts. Then the calls the continuous
round made are replayed with no environment, all submitted at once: pure generation, the ceiling.

Columns: wall seconds; episodes per minute; generated tokens per second and its ratio to pure generation;
the decode thread's busy share (the worker thread's time in decode streams / wall); mean rows per prefill;
requests that joined a running batch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from env_service_fixture import env_service  # noqa: E402
from turn_cache import run_round  # noqa: E402

from agentevolver.backends.cpu import HFGenerator  # noqa: E402
from agentevolver.client.env_client import EnvClient, EnvClientSettings  # noqa: E402
from agentevolver.config import load_config  # noqa: E402
from agentevolver.verl.agent_loop import flow_budgets  # noqa: E402
from agentevolver.verl.task_dataset import spread_over  # noqa: E402

MODES = ("closed", "continuous")


class Recorder:
    """The generator as the agent flow sees it, recording every call (replayed as pure generation)."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.calls: list[tuple[list[int], dict[str, Any]]] = []

    @property
    def stats(self) -> dict[str, float]:
        return self.inner.stats

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        self.calls.append((list(prompt_ids), dict(sampling_params)))
        return await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params,
                                         **kwargs)


async def pure_generation(generator: HFGenerator, calls: list[tuple[list[int], dict[str, Any]]]) -> dict[str, Any]:
    """Every recorded call at once, no environment: seconds, generated tokens and the generator's busy time."""
    before = dict(generator.stats)
    started = time.perf_counter()
    outputs = await asyncio.gather(*(generator.generate(f"pure-{i}", prompt_ids=prompt, sampling_params=params)
                                     for i, (prompt, params) in enumerate(calls)))
    seconds = time.perf_counter() - started
    stats = {key: generator.stats[key] - before[key] for key in before}
    return {"seconds": seconds, "stats": stats, "episodes": 0,
            "generated": sum(len(out.token_ids) for out in outputs)}


def sampling_of(cfg: Any, greedy: bool) -> dict[str, Any]:
    """The rollout's sampling (``--greedy``: validation's ``val_kwargs``), as verl's agent loop sends it."""
    source = cfg.actor_rollout_ref.rollout.val_kwargs if greedy else cfg.actor_rollout_ref.rollout
    return {"temperature": float(source.temperature), "top_p": float(source.top_p), "top_k": int(source.top_k),
            "logprobs": True}


async def main_async(args: argparse.Namespace, console: Console) -> None:
    cfg, settings = load_config([], config_name=args.preset)
    budgets = flow_budgets(cfg)
    sampling = sampling_of(cfg, args.greedy)
    model = str(cfg.actor_rollout_ref.model.path)
    modes = (*MODES, *(f"continuous, {rows} rows" for rows in args.also_rows),
             *(f"{base}, {k} drafts" for k in args.draft_tokens for base in MODES))
    generators = {}
    for mode in modes:
        base, _, extra = mode.partition(", ")
        count = int(extra.split()[0]) if extra else 0
        generators[mode] = HFGenerator.from_pretrained(
            model, dtype=args.dtype, seed=0, max_batch_size=count if extra.endswith("rows") else args.max_batch_size,
            default_max_tokens=budgets["max_response_len"], continuous_batching=base != "closed",
            draft_tokens=count if extra.endswith("drafts") else 0)
    env_type = settings.env_service.env_type
    split = settings.env_service.val_split if args.split == "val" else settings.env_service.train_split
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    recorded: list[tuple[list[int], dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp, env_service(env_type, tmp_path=Path(tmp)) as service:
        async with EnvClient(EnvClientSettings(env_url=service.url)) as env:
            task_ids = spread_over(await env.aget_env_profile(env_type, split), args.tasks)
            for mode in modes:  # warm-up: model, caches, connections
                await run_round(generators[mode], env, settings, budgets, task_ids[:2], sampling)
            for index in range(args.rounds):
                for mode in (modes if index % 2 == 0 else modes[::-1]):
                    recorder = Recorder(generators[mode])
                    result = await run_round(recorder, env, settings, budgets, task_ids, sampling,  # type: ignore[arg-type]
                                             rollouts=args.rollouts)
                    result["episodes"] = len(task_ids) * args.rollouts
                    result["generated"] = result["stats"]["generated_tokens"]
                    rounds[mode].append(result)
                    if mode == "continuous":
                        recorded = recorder.calls
    pure = await pure_generation(generators["continuous"], recorded)
    for generator in generators.values():
        await generator.aclose()
    best = {mode: min(runs, key=lambda r: r["seconds"]) for mode, runs in rounds.items()}
    best["pure generation"] = pure
    pure_rate = pure["generated"] / pure["seconds"]
    load = os.getloadavg()
    table = Table(title=f"continuous batching: {model} ({args.dtype}), {args.tasks} tasks x {args.rollouts} of "
                        f"{split}, {'greedy' if args.greedy else 'sampled'}, max {args.max_batch_size} rows, "
                        f"best of {args.rounds}; load {load[0]:.2f} at the end")
    for column in ("mode", "wall s", "vs closed", "episodes/min", "solved", "tokens/s", "vs pure generation",
                   "decode busy", "rows/prefill", "joined running", "tokens / decode step", "drafts kept"):
        table.add_column(column, justify="right")
    for mode, row in best.items():
        stats = row["stats"]
        rate = row["generated"] / row["seconds"]
        table.add_row(
            mode, f"{row['seconds']:.1f}",
            f"{best['closed']['seconds'] / row['seconds']:.2f}x" if mode in modes else "-",
            f"{60 * row['episodes'] / row['seconds']:.1f}" if row["episodes"] else "-",
            f"{row['success']}/{row['episodes']}" if row["episodes"] else "-",
            f"{rate:.0f}", f"{rate / pure_rate:.2f}x",
            f"{stats['model_seconds'] / row['seconds']:.0%}",
            f"{stats['rows'] / max(stats['batches'], 1):.1f}", f"{stats['joined_running']:.0f}",
            f"{stats['generated_tokens'] / max(stats['decode_steps'], 1):.1f}",
            f"{stats['accepted_tokens'] / stats['drafted_tokens']:.0%}" if stats["drafted_tokens"] else "-",
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quickstart", help="training preset (examples/) to take the model, "
                        "agent flow, budgets and splits from")
    parser.add_argument("--split", default="train", choices=["train", "val"])
    parser.add_argument("--tasks", type=int, default=4, help="tasks of the split (the quickstart's batch: 4)")
    parser.add_argument("--rollouts", type=int, default=4, help="episodes per task (the quickstart's rollout.n)")
    parser.add_argument("--greedy", action="store_true", help="validation's sampling (val_kwargs)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per mode")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--max-batch-size", type=int, default=16, help="as the CPU rollout server's default")
    parser.add_argument("--draft-tokens", type=int, nargs="*", default=[],
                        help="also run both modes with speculative decoding, up to K prompt-lookup drafts per row")
    parser.add_argument("--also-rows", type=int, nargs="*", default=[],
                        help="extra continuous modes with these max_batch_size values (e.g. 32 64)")
    args = parser.parse_args()
    asyncio.run(main_async(args, Console(width=200)))


if __name__ == "__main__":
    main()
