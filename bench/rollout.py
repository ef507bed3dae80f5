"""Episode throughput: concurrent episodes vs a serial loop, both against pure generation.

    .venv/bin/python bench/rollout.py [--model tiny-test] [--episodes 16] [--step-s 0.1] [--steps 3]

Seed 004's design question: an agent rollout alternates generation with environment steps that take wall
time; run serially, the model idles during every environment wait and the environment idles during every
generation. This runs the real agent flow (``AgentFlow``) against the real environment service serving
the ``sleepy`` environment (bench/bench_envs.py: each step sleeps ``--step-s``, episodes last ``--steps``
turns) with the batching CPU generator, three ways, in one process:

* ``pure generation``: the same number of generate calls (same prompts, same max_tokens) with no environment,
  all submitted at once: the ceiling the rollout can approach;
* ``serial``: one episode after the other (a plain for-loop over episodes);
* ``concurrent``: all episodes in flight at once (``runner.run_episodes``), generations batched.

Ratios are tokens/s against pure generation, measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from env_service_fixture import env_service  # noqa: E402

from agentevolver.backends.cpu import HFGenerator  # noqa: E402
from agentevolver.client.env_client import EnvClient, EnvClientSettings  # noqa: E402
from agentevolver.module.agent_flow import AgentFlow, AgentFlowConfig, EpisodeSpec  # noqa: E402
from agentevolver.module.agent_flow.runner import run_episodes  # noqa: E402

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


class RecordingGenerator:
    """Wraps the generator to record each call's prompt and max_tokens (replayed by the pure-generation run)."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], int]] = []
        self.tokens = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict) -> object:
        self.calls.append((list(prompt_ids), int(sampling_params["max_tokens"])))
        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        self.tokens += len(out.token_ids)
        return out


def specs(count: int, steps: int, step_s: float) -> list[EpisodeSpec]:
    return [EpisodeSpec(task_id=f"s{i}", env_type="sleepy", group_id=f"g{i}", rollout_id=0,
                        env_params={"steps": steps, "step_s": step_s}) for i in range(count)]


async def run_mode(mode: str, generator: HFGenerator, env: EnvClient, args: argparse.Namespace) -> dict:
    recorder = RecordingGenerator(generator)
    config = AgentFlowConfig(max_steps=args.steps + 1, max_tokens_per_turn=args.max_tokens,
                             madness={"enable": False})
    flow = AgentFlow(config, tokenizer=generator.tokenizer, env_client=env, generate=recorder.generate,
                     max_model_len=2048)
    episodes = specs(args.episodes, args.steps, args.step_s)
    started = time.perf_counter()
    if mode == "serial":
        results = [await flow.run(spec, SAMPLING) for spec in episodes]
    else:
        results = await run_episodes(flow, episodes, SAMPLING, concurrency=len(episodes))
    seconds = time.perf_counter() - started
    ended = sum(r.termination == "finished" for r in results)
    return {"mode": mode, "episodes": len(results), "finished": ended, "seconds": seconds,
            "tokens": recorder.tokens, "calls": recorder.calls}


async def pure_generation(generator: HFGenerator, calls: list[tuple[list[int], int]]) -> dict:
    started = time.perf_counter()
    outs = await asyncio.gather(*(generator.generate(f"pure{i}", prompt_ids=prompt, sampling_params={
        **SAMPLING, "max_tokens": max_tokens}) for i, (prompt, max_tokens) in enumerate(calls)))
    seconds = time.perf_counter() - started
    return {"mode": "pure generation", "episodes": 0, "finished": 0, "seconds": seconds,
            "tokens": sum(len(o.token_ids) for o in outs), "calls": calls}


async def main_async(args: argparse.Namespace, console: Console) -> None:
    generator = HFGenerator.from_pretrained(args.model, max_batch_size=args.max_batch_size, seed=0)
    with tempfile.TemporaryDirectory() as tmp, env_service(
            "sleepy", "--plugin", "bench_envs", tmp_path=Path(tmp),
            env={"PYTHONPATH": f"{ROOT / 'bench'}:{ROOT / 'tests'}"}) as service:
        async with EnvClient(EnvClientSettings(env_url=service.url)) as env:
            await run_mode("concurrent", generator, env, args)  # warm-up (model, caches, connections)
            concurrent = await run_mode("concurrent", generator, env, args)
            serial = await run_mode("serial", generator, env, args)
            pure = await pure_generation(generator, concurrent["calls"])
    await generator.aclose()
    table = Table(title=f"rollout throughput: {args.model}, {args.episodes} episodes x {args.steps} steps, "
                        f"{args.step_s * 1000:.0f} ms per env step")
    for column in ("mode", "episodes/s", "tokens/s", "vs pure generation", "wall s", "finished"):
        table.add_column(column, justify="right")
    base = pure["tokens"] / pure["seconds"]
    for row in (pure, serial, concurrent):
        rate = row["tokens"] / row["seconds"]
        episodes = f"{row['episodes'] / row['seconds']:.2f}" if row["episodes"] else "-"
        table.add_row(row["mode"], episodes, f"{rate:.0f}", f"{rate / base:.2f}x", f"{row['seconds']:.1f}",
                      f"{row['finished']}/{row['episodes']}" if row["episodes"] else "-")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-test", help="built-in name or model folder")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3, help="environment steps per episode")
    parser.add_argument("--step-s", type=float, default=0.1, help="seconds each environment step takes")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per turn")
    parser.add_argument("--max-batch-size", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main_async(args, Console()))


if __name__ == "__main__":
    main()
