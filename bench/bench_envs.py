"""Environments for benchmarks, loaded into the real service with ``--plugin bench_envs``.

``sleepy``: every step takes a fixed time (``params.step_s``, default 0.1 s) and answers with a short
observation; the episode ends after ``params.steps`` steps (default 3). It stands in for an environment whose
steps cost wall time (a browser, a sandbox, a remote API) without using CPU, so a benchmark measures how
well the rollout overlaps environment waits with generation.
"""

from __future__ import annotations

import time

from agentevolver.schema import ChatMessage
from env_service.base import BaseEnv, StepOutcome
from env_service.registry import register_env

TASKS = [f"s{i}" for i in range(256)]


@register_env("sleepy")
class SleepyEnv(BaseEnv):
    """Fixed-length episodes whose steps sleep (see the module docstring)."""

    isolation = "inline"

    @classmethod
    def splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        return TASKS

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        super().__init__(task_id, instance_id, params)
        self.step_s = float(params.get("step_s", 0.1))
        self.steps = int(params.get("steps", 3))
        self.done = 0

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content="Answer briefly."),
                ChatMessage(role="user", content=f"Task {self.task_id}: describe the number {len(self.task_id)}.")]

    def step(self, action: ChatMessage) -> StepOutcome:
        time.sleep(self.step_s)
        self.done += 1
        return StepOutcome(state=[ChatMessage(role="user", content=f"Noted ({self.done}). Continue.")],
                           is_terminated=self.done >= self.steps)

    def evaluate(self, sparse: bool) -> float:
        return 1.0 if self.done >= self.steps else 0.0
