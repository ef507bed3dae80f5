"""``trainer.agent_loop_workers`` (agentevolver/verl/in_process.py): verl's agent-loop workers in the trainer's
process where one worker on one node runs them, Ray actors otherwise.

Here the choice and the worker wrapper, with a worker class whose state is bound to its event loop as an
episode's connection pool is; training runs through verl's real ``AgentLoopWorker`` in process are every trainer
test's default (tests/test_main_ppo.py checks the console has no agent-loop worker process, and its attributed
run keeps verl's actors with ``trainer.agent_loop_workers=actor``).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from omegaconf import OmegaConf

from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.verl import in_process, prestart

MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def _config(*overrides: str):
    return compose_config(["actor_rollout_ref.model.path=tiny-test", *overrides], config_name="quickstart")


def test_auto_runs_the_cpu_presets_one_worker_in_process_and_sets_verls_manager() -> None:
    cfg = _config()
    assert cfg.actor_rollout_ref.rollout.agent.num_workers == 1 and cfg.trainer.agent_loop_workers == "auto"
    assert in_process.choose(cfg)
    assert OmegaConf.select(cfg, MANAGER_KEY) == in_process.MANAGER_CLASS
    # prestart then starts the rollout server only: the manager is not its own (nothing started here: no Ray)
    assert OmegaConf.select(cfg, MANAGER_KEY) != prestart.MANAGER_CLASS


@pytest.mark.parametrize("override", [
    "actor_rollout_ref.rollout.agent.num_workers=2", "trainer.nnodes=2", "trainer.use_v1=true",
    f"+{MANAGER_KEY}=my.module.MyManager", "trainer.agent_loop_workers=actor"])
def test_auto_keeps_verls_actors_where_in_process_does_not_fit(override: str) -> None:
    cfg = _config(override)
    before = OmegaConf.select(cfg, MANAGER_KEY, default=None)
    assert not in_process.choose(cfg)
    assert OmegaConf.select(cfg, MANAGER_KEY, default=None) == before


@pytest.mark.parametrize(("override", "named"), [
    ("actor_rollout_ref.rollout.agent.num_workers=2", "actor_rollout_ref.rollout.agent.num_workers is 2"),
    ("trainer.nnodes=2", "trainer.nnodes is 2"),
    (f"+{MANAGER_KEY}=my.module.MyManager", "my.module.MyManager")])
def test_in_process_where_it_cannot_run_says_why_and_what_to_set(override: str, named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        in_process.runs_in_process(_config("trainer.agent_loop_workers=in_process", override))
    assert named in str(raised.value) and "trainer.agent_loop_workers=auto" in str(raised.value)


def test_a_bad_choice_is_named_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.agent_loop_workers: must be one of auto, in_process, actor"):
        prepare_config(_config("trainer.agent_loop_workers=thread"))


class _Worker:
    """A stand-in for verl's worker at the edge of the wrapper: its state is bound to the loop it was built on
    (an ``asyncio.Queue`` made in ``__init__``, as an episode's connection pool is bound to its loop)."""

    def __init__(self, prefix: str, shared: list[int]) -> None:
        self.loop = asyncio.get_running_loop()
        self.thread = threading.current_thread().name
        self.inbox: asyncio.Queue[int] = asyncio.Queue()
        self.prefix, self.shared = prefix, shared

    async def generate(self, batch: list[int], delay: float) -> dict:
        assert asyncio.get_running_loop() is self.loop
        batch.append(-1)  # mutates its copy, never the caller's
        await self.inbox.put(len(batch))
        await asyncio.sleep(delay)
        return {"prefix": self.prefix, "batch": batch, "thread": threading.current_thread().name}

    def count(self) -> int:
        return self.inbox.qsize()

    async def fail(self) -> None:
        raise ValueError("episode source broke")


def test_a_worker_runs_on_its_own_loop_with_copies_of_its_arguments_like_an_actor() -> None:
    shared = [1, 2]
    worker = in_process.InProcessWorker(_Worker, "agent_loop_worker_0", "w", shared)
    try:
        batch = [7]

        async def manager() -> list[dict]:
            # verl's manager: asyncio.gather over .remote() calls, from a loop of its own (auto_await)
            return await asyncio.gather(worker.generate.remote(batch, 0.2), worker.generate.remote(batch, 0.0))

        first, second = asyncio.run(manager())
        assert first == {"prefix": "w", "batch": [7, -1], "thread": "agent_loop_worker_0"}
        assert second["batch"] == [7, -1] and batch == [7]  # each call got its own copy
        assert asyncio.run(_await(worker.count.remote())) == 2  # a plain method, on the worker's loop too
        assert shared == [1, 2] and worker.name == "agent_loop_worker_0"
        # a second manager loop (auto_await runs each call in a new one) reaches the same worker state
        assert asyncio.run(_await(worker.generate.remote([], 0.0)))["batch"] == [-1]
        with pytest.raises(ValueError, match="episode source broke"):
            asyncio.run(_await(worker.fail.remote()))
        with pytest.raises(AttributeError):
            worker._private  # noqa: B018 - only the worker's public methods are callable
    finally:
        worker.stop()
    assert not worker._thread.is_alive()


async def _await(awaitable):
    return await awaitable
