"""Turn cache on vs off: greedy validation episodes on calc's hard levels through the real agent flow.

    .venv/bin/python bench/turn_cache.py [--tasks 16] [--rounds 2] [--dtype bfloat16] [--preset quickstart_hard]

Why: a multi-turn episode sends its whole conversation every turn, and before the turn cache
(agentevolver/backends/cpu/turn_cache.py, docs/cpu_generator.md) the CPU generator prefilled everything
after the shared opening again each turn. This runs what a validation round runs: the preset's model,
agent flow and budgets, greedy sampling (``rollout.val_kwargs``), all episodes in flight, against a real
env service (``calc``), on ``--tasks`` tasks of the preset's validation split. Two generators in one
process, one with the cache and one without (``turn_cache_mb=0``), alternate (off, on, on, off, ...) so a
drift of the machine's load falls on both; the best round of each counts. The ratio is seconds off /
seconds on (>1: the cache is faster).

Also printed: prompt tokens prefilled (the rest came from the shared-prefix and turn caches), the success
count, and how many episodes generated exactly the same tokens in both modes (greedy; bf16 can flip a
near-tie between batch shapes).
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

from env_service_fixture import env_service  # noqa: E402

from agentevolver.backends.cpu import HFGenerator  # noqa: E402
from agentevolver.client.env_client import EnvClient, EnvClientSettings  # noqa: E402
from agentevolver.config import load_config  # noqa: E402
from agentevolver.module.agent_flow import AgentFlow  # noqa: E402
from agentevolver.module.agent_flow.runner import group_specs, run_episodes  # noqa: E402
from agentevolver.module.task_manager.store import original_objectives  # noqa: E402
from agentevolver.verl.agent_loop import flow_budgets  # noqa: E402
from agentevolver.verl.task_dataset import spread_over  # noqa: E402


async def run_round(generator: HFGenerator, env: EnvClient, settings: Any, budgets: dict[str, int],
                    task_ids: list[str], sampling: dict[str, Any], rollouts: int = 1) -> dict[str, Any]:
    """One round: ``rollouts`` episodes per task, all in flight; wall time, token counts and the generator's
    stats over the round (``stats``). Also run by bench/continuous_batching.py."""
    flow = AgentFlow(settings.agent_flow, tokenizer=generator.tokenizer, env_client=env,
                     generate=generator.generate, **budgets)
    specs = group_specs(original_objectives(task_ids, settings.env_service.env_type, "env"), rollouts,
                        env_params=settings.env_service.create_params)
    before = dict(generator.stats)
    started = time.perf_counter()
    results = await run_episodes(flow, specs, sampling, concurrency=len(specs))
    seconds = time.perf_counter() - started
    delta = {key: generator.stats[key] - before[key] for key in before}
    prefilled = delta["prompt_tokens"] - delta["prefix_cached_tokens"] - delta["turn_cached_tokens"]
    return {"seconds": seconds, "prefilled": prefilled, "prompt_tokens": delta["prompt_tokens"],
            "turn_cached": delta["turn_cached_tokens"], "success": sum(r.success for r in results),
            "turns": sum(r.num_turns for r in results) / max(len(results), 1),
            "tokens": [tuple(tuple(sample.response_ids) for sample in r.samples) for r in results],
            "stats": delta}


async def main_async(args: argparse.Namespace, console: Console) -> None:
    cfg, settings = load_config([], config_name=args.preset)
    rollout = cfg.actor_rollout_ref.rollout
    budgets = flow_budgets(cfg)
    sampling = {"temperature": float(rollout.val_kwargs.temperature), "top_p": float(rollout.val_kwargs.top_p),
                "top_k": int(rollout.val_kwargs.top_k), "logprobs": True}
    model = str(cfg.actor_rollout_ref.model.path)
    generators = {
        mode: HFGenerator.from_pretrained(model, dtype=args.dtype, max_batch_size=args.max_batch_size, seed=0,
                                          default_max_tokens=budgets["max_response_len"],
                                          turn_cache_mb=budget)
        for mode, budget in (("off", 0), ("on", args.turn_cache_mb))
    }
    env_type = settings.env_service.env_type
    with tempfile.TemporaryDirectory() as tmp, env_service(env_type, tmp_path=Path(tmp)) as service:
        async with EnvClient(EnvClientSettings(env_url=service.url)) as env:
            split = settings.env_service.val_split
            task_ids = spread_over(await env.aget_env_profile(env_type, split), args.tasks)
            for mode in ("off", "on"):  # warm-up: model, caches, connections
                await run_round(generators[mode], env, settings, budgets, task_ids[:2], sampling)
            rounds: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for index in range(args.rounds):
                for mode in (("off", "on") if index % 2 == 0 else ("on", "off")):
                    rounds[mode].append(await run_round(generators[mode], env, settings, budgets, task_ids,
                                                        sampling))
    for generator in generators.values():
        await generator.aclose()
    best = {mode: min(runs, key=lambda r: r["seconds"]) for mode, runs in rounds.items()}
    same = sum(a == b for a, b in zip(best["off"]["tokens"], best["on"]["tokens"], strict=True))
    load = os.getloadavg()
    table = Table(title=f"turn cache: {model} ({args.dtype}), {len(task_ids)} greedy episodes of {split}, "
                        f"best of {args.rounds}; load {load[0]:.2f} at the end")
    for column in ("turn cache", "wall s", "vs off", "prompt tokens", "prefilled", "from turn cache",
                   "mean turns", "solved", "same tokens as off"):
        table.add_column(column, justify="right")
    for mode in ("off", "on"):
        row = best[mode]
        table.add_row(mode, f"{row['seconds']:.1f}", f"{best['off']['seconds'] / row['seconds']:.2f}x",
                      f"{row['prompt_tokens']:.0f}", f"{row['prefilled']:.0f}", f"{row['turn_cached']:.0f}",
                      f"{row['turns']:.2f}", f"{row['success']}/{len(task_ids)}",
                      "-" if mode == "off" else f"{same}/{len(task_ids)}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quickstart_hard", help="training preset (examples/) to take the "
                        "model, agent flow, budgets and validation split from")
    parser.add_argument("--tasks", type=int, default=16, help="validation tasks, one greedy episode each")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per mode")
    parser.add_argument("--dtype", default="bfloat16", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--max-batch-size", type=int, default=16, help="as the CPU rollout server's default")
    parser.add_argument("--turn-cache-mb", type=float, default=1024)
    args = parser.parse_args()
    asyncio.run(main_async(args, Console()))


if __name__ == "__main__":
    main()
