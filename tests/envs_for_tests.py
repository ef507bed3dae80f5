"""Environments that misbehave on purpose, loaded into a real service with ``--plugin envs_for_tests``.

They are test doubles for *environments* (the edge); the thing under test is the service around them.
"""

from __future__ import annotations

import itertools
import os
import time

from agentevolver.schema import ChatMessage
from env_service.base import BaseEnv, StepOutcome
from env_service.errors import UnknownTask
from env_service.registry import register_env

TASKS = [f"t{i}" for i in range(10)]


class _TenTasks(BaseEnv):
    """Splits of the test environments: train = t0..t7, val = t8, t9."""

    @classmethod
    def splits(cls) -> list[str]:
        return ["train", "val"]

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        return TASKS[:8] if split == "train" else TASKS[8:]


class _Echo(_TenTasks):
    """Echoes the action; ``bye`` ends the episode; ``crash`` / ``hang`` / ``raise`` misbehave; ``bye-crash``
    ends it and crashes the instance at /evaluate."""

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        if task_id not in TASKS:
            raise UnknownTask(f"no task {task_id!r} in {self.name}", field="task_id")
        if params.get("hang_on_create"):
            time.sleep(3600)
        super().__init__(task_id, instance_id, params)
        self.said_bye = False
        self.crash_on_evaluate = False
        self.steps = 0

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content="echo"), ChatMessage(role="user", content=f"task {self.task_id}")]

    def step(self, action: ChatMessage) -> StepOutcome:
        self.steps += 1
        if action.content == "crash":
            os._exit(13)
        if action.content == "hang":
            time.sleep(3600)
        if action.content == "raise":
            raise RuntimeError("the environment has a bug")
        self.said_bye = action.content == "bye"
        self.crash_on_evaluate = action.content == "bye-crash"
        return StepOutcome(state=[ChatMessage(role="user", content=f"echo: {action.content}")], reward=0.0,
                           is_terminated=self.said_bye or self.crash_on_evaluate,
                           info={"steps": self.steps, "pid": os.getpid()})

    def evaluate(self, sparse: bool) -> float:
        if self.crash_on_evaluate:
            os._exit(13)
        return 1.0 if self.said_bye else (0.0 if sparse else 0.5)


@register_env("echo")
class EchoInline(_Echo):
    isolation = "inline"


@register_env("echo_process")
class EchoProcess(_Echo):
    isolation = "process"


@register_env("lottery")
class Lottery(_TenTasks):
    """One-step episodes whose score is the parity of the answer's character codes.

    A reward that varies between samples of the same task whatever model answers, so GRPO groups get
    non-zero advantages even from a random model (the trainer tests need the update to do something).
    """

    isolation = "inline"

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        super().__init__(task_id, instance_id, params)
        self.score = 0.0

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content="Answer in a few words."),
                ChatMessage(role="user", content=f"Task {self.task_id}: say something.")]

    def step(self, action: ChatMessage) -> StepOutcome:
        self.score = float(sum(map(ord, action.content)) % 2)
        return StepOutcome(state=[], reward=self.score, is_terminated=True)

    def evaluate(self, sparse: bool) -> float:
        return self.score


@register_env("lottery_flaky")
class LotteryFlaky(Lottery):
    """``lottery`` where every third instance the service creates raises at its step (a 502 ``instance_failed``
    the episode ends on): with 4 episodes per training step and no retries, one episode of each of the first
    two steps fails, whatever order they run in."""

    created = 0

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        super().__init__(task_id, instance_id, params)
        LotteryFlaky.created += 1
        self.number = LotteryFlaky.created

    def step(self, action: ChatMessage) -> StepOutcome:
        if self.number % 3 == 0:
            raise RuntimeError(f"lottery_flaky: instance number {self.number} fails on purpose")
        return super().step(action)


@register_env("lottery_broken")
class LotteryBroken(Lottery):
    """``lottery`` whose every /create fails (the instance raises while it is built): every episode fails."""

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        raise RuntimeError("lottery_broken: this environment cannot create instances")


#: ``lottery_outage`` kills its service once: at the first step after :data:`OUTAGE_AFTER_ENV` steps, while this file
#: exists (it is removed first).
OUTAGE_MARKER_ENV = "LOTTERY_OUTAGE_MARKER"
#: How many steps the service answers before the outage (a count kept by the service process).
OUTAGE_AFTER_ENV = "LOTTERY_OUTAGE_AFTER_STEPS"

_outage_steps = itertools.count(1)


@register_env("lottery_outage")
class LotteryOutage(Lottery):
    """``lottery`` whose whole service process dies once, mid-rollout: at step number ``$LOTTERY_OUTAGE_AFTER_STEPS``
    + 1 of the process (a test gives the steps of the steps before the one to break), if the file named by
    ``$LOTTERY_OUTAGE_MARKER`` exists. The file is removed first, so the service the launcher starts again lives
    on. A count, not a file the test writes when a step is done: a one-step episode's rollout could be over
    before such a file appeared."""

    def step(self, action: ChatMessage) -> StepOutcome:
        marker = os.environ.get(OUTAGE_MARKER_ENV)
        served = next(_outage_steps)
        if marker and served > int(os.environ.get(OUTAGE_AFTER_ENV, "0")) and os.path.exists(marker):
            os.remove(marker)
            os._exit(17)  # the service dies with every live instance: an outage, not an instance failure
        return super().step(action)


@register_env("lottery_turns")
class LotteryTurns(_TenTasks):
    """Three-step episodes scored like ``lottery`` on the last answer: a multi-turn episode whose reward varies
    between samples whatever model answers, so multi-sample context managers get non-zero advantages."""

    isolation = "inline"
    turns = 3

    def __init__(self, task_id: str, instance_id: str, params: dict) -> None:
        super().__init__(task_id, instance_id, params)
        self.score = 0.0
        self.steps = 0

    def reset(self) -> list[ChatMessage]:
        return [ChatMessage(role="system", content="Answer in a few words."),
                ChatMessage(role="user", content=f"Task {self.task_id}: say something, three times.")]

    def step(self, action: ChatMessage) -> StepOutcome:
        self.steps += 1
        self.score = float(sum(map(ord, action.content)) % 2)
        done = self.steps >= self.turns
        state = [] if done else [ChatMessage(role="user", content=f"Turn {self.steps + 1}: again.")]
        return StepOutcome(state=state, reward=self.score if done else 0.0, is_terminated=done)

    def evaluate(self, sparse: bool) -> float:
        return self.score
