"""Rollout-only job: run the policy on an environment's tasks and write the rollout dump, no training.

    python -m agentevolver.rollout --split val --num-tasks 8 [--n 4] [--greedy] [hydra overrides ...]

Uses the same config as training (model ``actor_rollout_ref.model.path``, sampling ``actor_rollout_ref
.rollout.*``, budgets ``data.max_prompt_length`` + ``rollout.response_length``, ``env_service``,
``agent_flow``) and the same agent flow, with the CPU generator (transformers) serving generations. The
episodes go to ``<run dir>/rollouts/step_<N>.jsonl`` (docs/rollout_dumps.md) and a summary table is
printed. Use it to check a setup before training, to measure a baseline, or to look at what a checkpoint
does (``actor_rollout_ref.model.path=<checkpoint folder>``). With ``memory.enable_context_generator=true``
episodes get experience from the memory service as validation rollouts do (``exp_manager.val_rollout_mode``:
e.g. ``exp_mode=exist_train exp_manager.val_rollout_mode=all memory.workspace_id=<memory>`` measures a
memory's effect on the policy).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentevolver.config import load_config
from agentevolver.errors import AgentEvolverError, ConfigError
from agentevolver.module.agent_flow.plugins import plugin_name_errors

__all__ = ["main", "run_rollout"]

logger = logging.getLogger(__name__)


def _sampling_params(rollout: Any, greedy: bool) -> dict[str, Any]:
    source = rollout.val_kwargs if greedy else rollout
    return {"temperature": float(source.temperature), "top_p": float(source.top_p), "top_k": int(source.top_k),
            "logprobs": bool(rollout.calculate_log_probs)}


async def run_rollout(args: argparse.Namespace, console: Console) -> tuple[list[Any], Path | None]:
    """Run the job described by ``args``; returns the episode results and the dump path (None if off)."""
    from agentevolver.backends.cpu import HFGenerator
    from agentevolver.client.env_client import EnvClient
    from agentevolver.module.agent_flow import AgentFlow, RolloutDumpWriter
    from agentevolver.module.agent_flow.dump import rollout_dump_dir
    from agentevolver.module.agent_flow.flow import clipper_for
    from agentevolver.module.agent_flow.runner import group_specs, run_episodes
    from agentevolver.module.task_manager.store import original_objectives
    from agentevolver.verl.agent_loop import flow_budgets, retriever_for
    from agentevolver.verl.task_dataset import spread_over

    cfg, settings = load_config(args.overrides, config_name=args.config_name, checks=(plugin_name_errors,))
    rollout = cfg.actor_rollout_ref.rollout
    env_type = settings.env_service.env_type
    n = args.n if args.n is not None else int(rollout.n)
    budgets = flow_budgets(cfg)
    generator = HFGenerator.from_pretrained(str(cfg.actor_rollout_ref.model.path), dtype=args.dtype,
                                            max_batch_size=args.max_batch_size, seed=args.seed,
                                            default_max_tokens=budgets["max_response_len"])
    async with EnvClient.from_config(settings.env_service) as env:
        if args.task_id:
            task_ids = list(args.task_id)
        else:
            task_ids = spread_over(await env.aget_env_profile(env_type, args.split), args.num_tasks)
        if not task_ids:
            raise ConfigError(f"--split {args.split!r} of environment {env_type!r} has no tasks")
        flow = AgentFlow(settings.agent_flow, tokenizer=generator.tokenizer, env_client=env,
                         generate=generator.generate, clipper=clipper_for(settings.agent_flow, settings.llm),
                         retriever=retriever_for(cfg), **budgets)
        specs = group_specs(original_objectives(task_ids, env_type, "env"), n,
                            env_params=settings.env_service.create_params)
        if settings.memory.enable_context_generator:
            specs = _with_experience_plan(specs, settings.exp_manager, args.step)
        sampling = _sampling_params(rollout, args.greedy)
        with Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            bar = progress.add_task("episodes", total=len(specs))
            results = await run_episodes(flow, specs, sampling, concurrency=args.concurrency,
                                         on_done=lambda _: progress.advance(bar))
    await generator.aclose()
    dump_path = None
    if settings.agent_flow.dump.enable:
        run_dir = args.run_dir or str(cfg.trainer.default_local_dir)
        writer = RolloutDumpWriter(rollout_dump_dir(settings.agent_flow.dump.dir, run_dir),
                                   include_messages=settings.agent_flow.dump.include_messages)
        dump_path = writer.write(args.step, results)
    return results, dump_path


def _with_experience_plan(specs: list[Any], exp: Any, step: int) -> list[Any]:
    """Mark the episodes that get experience, drawn per group like validation rollouts (nothing is trained,
    so nothing is stripped)."""
    from agentevolver.module.exp_manager.manager import draw_plan

    plan = draw_plan(exp, [spec.group_id for spec in specs], validate=True, step=step)
    return [spec.model_copy(update={"add_experience": add}) for spec, add in zip(specs, plan.add_experience,
                                                                                  strict=True)]


def summary_table(results: list[Any], seconds: float) -> Table:
    """Episodes, success, reward, turns, tokens and how episodes ended."""
    table = Table(title="rollout", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    count = len(results) or 1
    ends = Counter(r.termination for r in results)
    tokens = sum(r.metrics.get("episode/generated_tokens", 0.0) for r in results)
    rows = [
        ("episodes", str(len(results))),
        ("success rate", f"{100 * sum(r.success for r in results) / count:.1f}%"),
        ("mean reward", f"{sum(r.reward.outcome for r in results) / count:.3f}"),
        ("mean turns", f"{sum(r.num_turns for r in results) / count:.2f}"),
        ("generated tokens", f"{tokens:.0f}"),
        ("episodes / s", f"{len(results) / seconds:.2f}" if seconds > 0 else "-"),
        ("with experience", str(sum(r.metrics.get("exp/injected", 0.0) > 0 for r in results))),
        ("ended by", ", ".join(f"{k} {v}" for k, v in sorted(ends.items()))),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agentevolver.rollout", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config-name", default="agentevolver",
                        help="config or preset to start from (e.g. quickstart from examples/; default the root)")
    parser.add_argument("--split", default="val", help="environment split to take tasks from (default val)")
    parser.add_argument("--num-tasks", type=int, default=8,
                        help="N task ids spread evenly over the split (default 8)")
    parser.add_argument("--task-id", action="append", help="run this task id (repeatable; overrides --split)")
    parser.add_argument("--n", type=int, default=None, help="episodes per task (default rollout.n)")
    parser.add_argument("--greedy", action="store_true", help="sample with rollout.val_kwargs (validation)")
    parser.add_argument("--run-dir", default=None, help="run folder (default trainer.default_local_dir)")
    parser.add_argument("--step", type=int, default=0, help="step number of the dump file (default 0)")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight (default 32)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="generations batched together")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="model dtype on CPU (default auto: bfloat16 where the CPU has bf16 units, else float32)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (reproducible runs)")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. env_service.env_type=calc")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)  # options and overrides in any order
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if args.num_tasks < 1 or args.concurrency < 1 or (args.n is not None and args.n < 1):
        console.print("[red]error:[/] --num-tasks, --concurrency and --n must be >= 1")
        return 2
    started = time.perf_counter()
    try:
        results, dump_path = asyncio.run(run_rollout(args, console))
    except AgentEvolverError as err:
        console.print(f"[red]error:[/] {err}")
        return 2
    console.print(summary_table(results, time.perf_counter() - started))
    if dump_path is not None:
        console.print(f"rollout dump: {dump_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
