"""Run many episodes concurrently outside verl's agent-loop manager (evaluation, rollout-only jobs).

Episodes of all groups share one event loop: while one waits for the environment, others generate, and a
batching generator (the CPU backend) serves the concurrent generations together. ``concurrency`` bounds
the episodes in flight (each holds an environment instance).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.agent_flow.flow import AgentFlow
from agentevolver.schema.task import TaskObjective

__all__ = ["group_specs", "run_episodes"]


def group_specs(
    objectives: Sequence[TaskObjective], n: int, *, experience: str | None = None,
    env_params: Mapping[str, Any] | None = None,
) -> list[EpisodeSpec]:
    """``n`` episodes per task (one GRPO group each, group id = task id), each created with ``env_params``."""
    if n < 1:
        raise ValueError(f"n (episodes per task) must be >= 1; got {n}")
    return [EpisodeSpec.for_objective(objective, group_id=objective.task.task_id, rollout_id=rollout_id,
                                      env_params=env_params, experience=experience)
            for objective in objectives for rollout_id in range(n)]


async def run_episodes(
    flow: AgentFlow,
    specs: Sequence[EpisodeSpec],
    sampling_params: Mapping[str, Any],
    *,
    concurrency: int = 32,
    on_done: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Run ``specs`` with at most ``concurrency`` in flight; results in the order of ``specs``."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1; got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: EpisodeSpec) -> EpisodeResult:
        async with gate:
            result = await flow.run(spec, sampling_params)
        if on_done is not None:
            on_done(result)
        return result

    return list(await asyncio.gather(*(one(spec) for spec in specs)))
