"""Greedy validation that timing cannot change, batched vs one request at a time, against plain batching.

    .venv/bin/python bench/invariant_validation.py                          # 60 tasks of calc's eval split
    .venv/bin/python bench/invariant_validation.py --tasks 200 --rounds 1   # the whole eval split
    .venv/bin/python bench/invariant_validation.py --arms plain "invariant, batched" --also-rows 32 64

Why: issue 43 needs two validations of one checkpoint to agree task by task, whatever the timing; issue 44
needs validation at generation speed. ``batch_invariant_greedy`` first bought the agreement by decoding every
greedy request in a batch of its own. Now a greedy request is prefilled alone and decodes beside the others,
where a start-up probe shows this machine's decode step computes a row alike in any company. This runs one
preset's greedy validation episodes (its model, agent flow and budgets; every task once, all in flight,
against a real env service) with generators in one process:

* ``plain``: batch_invariant_greedy off (closed batches, shared-prefix and turn caches): the default;
* ``invariant, alone``: batch_invariant_greedy on, each greedy request decoded alone and every prompt
  prefilled whole (the probe's fallback with ``chunk_cache_mb=0``: what the option did before);
* ``invariant, batched``: batch_invariant_greedy on, rows decoded together (closed batches);
* ``invariant, continuous``: the same with continuous batching;
* ``continuous``: plain with continuous batching (``--join-free-rows`` adds it at other join thresholds; with
  ``--draft-tokens`` it also runs speculatively).

Rounds alternate arm order so a drift of the machine's load falls on all; the best round of each counts.
"same as alone" counts the episodes whose every response is token-identical to the ``invariant, alone``
round's: the invariant arms must show all of them. "same as plain" counts them against the ``plain`` round: a
speculative arm (``--draft-tokens``) keeps a drafted token where the block's logits make it the argmax, which
a one-token step's bf16 numbers may not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from continuous_batching import sampling_of  # noqa: E402
from env_service_fixture import env_service  # noqa: E402
from turn_cache import run_round  # noqa: E402

from agentevolver.backends.cpu import HFGenerator  # noqa: E402
from agentevolver.client.env_client import EnvClient, EnvClientSettings  # noqa: E402
from agentevolver.config import load_config  # noqa: E402
from agentevolver.verl.agent_loop import flow_budgets  # noqa: E402
from agentevolver.verl.task_dataset import spread_over  # noqa: E402

#: arm -> (batch_invariant_greedy, decode rows together, continuous_batching)
ARMS: dict[str, tuple[bool, bool, bool]] = {
    "plain": (False, True, False),
    "invariant, alone": (True, False, False),
    "invariant, batched": (True, True, False),
    "invariant, continuous": (True, True, True),
    "continuous": (False, True, True),
}
BASELINE = "invariant, alone"


def arm_rows(arm: str, args: argparse.Namespace) -> tuple[str, int, int, int]:
    """``"plain, rows 32"`` -> ("plain", 32, 0, 1), ``"continuous, drafts 6, join 4"`` -> ("continuous", 16, 6,
    4): the arm, its max_batch_size (default ``--max-batch-size``), its speculative draft length (default none)
    and its join_free_rows (default 1)."""
    name, *options = arm.split(", ")
    values = {"rows": args.max_batch_size, "drafts": 0, "join": 1}
    for option in options:
        key, _, value = option.partition(" ")
        values[key] = int(value)
    return name, values["rows"], values["drafts"], values["join"]


def make_generator(model: str, arm: str, args: argparse.Namespace, max_tokens: int) -> HFGenerator:
    arm, rows, drafts, join = arm_rows(arm, args)
    invariant, together, continuous = ARMS[arm]
    generator = HFGenerator.from_pretrained(model, dtype=args.dtype, seed=0, max_batch_size=rows, draft_tokens=drafts,
                                            default_max_tokens=max_tokens, continuous_batching=continuous,
                                            join_free_rows=join,
                                            batch_invariant_greedy=invariant,
                                            chunk_cache_mb=512 if together else 0)
    if invariant and together and not generator.rows_independent:
        raise SystemExit(f"{arm}: the row-independence probe failed on this machine ({args.dtype}); greedy "
                         "requests would decode alone, so the arm would measure nothing new")
    if invariant and not together:
        generator.rows_independent = False  # the probe's fallback: each greedy request in a batch of its own
    return generator


async def main_async(args: argparse.Namespace, console: Console) -> None:
    cfg, settings = load_config(args.overrides, config_name=args.preset)
    budgets = flow_budgets(cfg)
    sampling = sampling_of(cfg, greedy=True)
    model = str(cfg.actor_rollout_ref.model.path)
    arms = [arm for arm in ARMS if arm in args.arms]
    arms += [f"{arm}, rows {rows}" for rows in args.also_rows for arm in arms if ARMS[arm][1]]  # decoded together
    arms += [f"{arm}, join {join}" for join in args.join_free_rows for arm in arms if arm == "continuous"]
    plain = [arm for arm in arms if arm.startswith(("plain", "continuous")) and ", rows" not in arm]
    # speculative decoding skips timing-proof rows: the plain and continuous arms only
    arms += [f"{arm}, drafts {k}" for k in args.draft_tokens for arm in plain]
    arms += [f"{arm}, drafts {k}, rows {rows}" for k in args.draft_tokens for rows in args.also_rows for arm in plain]
    generators = {arm: make_generator(model, arm, args, budgets["max_response_len"]) for arm in arms}
    env_type = settings.env_service.env_type
    split = args.split or settings.env_service.val_split
    rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as tmp, env_service(env_type, tmp_path=Path(tmp)) as service:
        async with EnvClient(EnvClientSettings(env_url=service.url)) as env:
            task_ids = spread_over(await env.aget_env_profile(env_type, split), args.tasks)
            for arm in arms:  # warm-up: model, caches, connections
                await run_round(generators[arm], env, settings, budgets, task_ids[:2], sampling)
            for index in range(args.rounds):
                for arm in (arms if index % 2 == 0 else arms[::-1]):
                    rounds[arm].append(await run_round(generators[arm], env, settings, budgets, task_ids, sampling))
                    console.print(f"round {index} {arm}: {rounds[arm][-1]['seconds']:.1f} s "
                                  f"(load {os.getloadavg()[0]:.2f})")
    for generator in generators.values():
        await generator.aclose()
    best = {arm: min(runs, key=lambda r: r["seconds"]) for arm, runs in rounds.items()}
    reference = best.get(BASELINE)
    load = os.getloadavg()
    table = Table(title=f"greedy validation: {model} ({args.dtype}), {len(task_ids)} tasks of {env_type} "
                        f"{split}, max {args.max_batch_size} rows, best of {args.rounds}; load {load[0]:.2f} "
                        "at the end")
    for column in ("arm", "wall s", f"vs {BASELINE}", "vs plain", "tokens/s", "solved", "rows/decode step",
                   "prefilled tokens", "same as alone", "same as plain"):
        table.add_column(column, justify="right")
    for arm, row in best.items():
        stats = row["stats"]
        same = {name: "-" if other is None else
                f"{sum(a == b for a, b in zip(row['tokens'], other['tokens'], strict=True))}/{len(task_ids)}"
                for name, other in (("alone", reference), ("plain", best.get("plain")))}
        table.add_row(
            arm, f"{row['seconds']:.1f}",
            f"{reference['seconds'] / row['seconds']:.2f}x" if reference else "-",
            f"{best['plain']['seconds'] / row['seconds']:.2f}x" if "plain" in best else "-",
            f"{stats['generated_tokens'] / row['seconds']:.0f}", f"{row['success']}/{len(task_ids)}",
            f"{stats['generated_tokens'] / max(stats['decode_steps'], 1):.1f}",
            f"{row['prefilled']:.0f}", same["alone"], same["plain"],
        )
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="calc_self_questioning",
                        help="preset (examples/) to take the model, agent flow, budgets and env from")
    parser.add_argument("--split", default="eval", help="the env's split to validate on ('' = the preset's)")
    parser.add_argument("--tasks", type=int, default=60, help="tasks, spread over the split")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per arm")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--max-batch-size", type=int, default=16, help="as the CPU rollout server's default")
    parser.add_argument("--draft-tokens", type=int, nargs="*", default=[],
                        help="also run plain batching with speculative decoding, up to K prompt-lookup drafts per row "
                             "(at --max-batch-size and at every --also-rows)")
    parser.add_argument("--also-rows", type=int, nargs="*", default=[],
                        help="also run every batched arm at these max_batch_size values (one process, so the "
                             "ratios compare like with like)")
    parser.add_argument("--join-free-rows", type=int, nargs="*", default=[],
                        help="also run the continuous arm with joiners admitted once this many rows are free "
                             "(the generator's join_free_rows; the arm itself uses 1)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), metavar="ARM",
                        help=f"arms to run (default all: {', '.join(ARMS)})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for the preset")
    args = parser.parse_args()
    asyncio.run(main_async(args, Console(width=200)))


if __name__ == "__main__":
    main()
