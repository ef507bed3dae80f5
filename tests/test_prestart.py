"""``trainer.prestart`` (agentevolver/verl/prestart.py): the rollout server and agent-loop worker processes start
with the training workers and are handed to verl only when they match what verl would have started.

Here a real local Ray and the real ``hf`` server on tiny-test (an actor, the default; with
``trainer.rollout_server=worker`` the training worker hosts it and nothing is prestarted for it); the hand-over
inside a training run is checked end to end in tests/test_main_ppo.py (the baseline run's agent-loop worker is the
prestarted one; the attributed run, ``trainer.prestart=false``, starts verl's own).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from omegaconf import OmegaConf

from agentevolver.config import compose_config
from agentevolver.main_ppo import prepare_config
from agentevolver.verl import prestart

MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def _config(*overrides: str):
    cfg = compose_config(["actor_rollout_ref.model.path=tiny-test", *overrides], config_name="quickstart")
    return prepare_config(cfg)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray

    from agentevolver.verl.driver_runner import runtime_env_vars

    ray.init(num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": runtime_env_vars(_config())})
    try:
        yield
    finally:
        ray.shutdown()


def test_off_starts_nothing_and_leaves_verls_manager() -> None:
    cfg = _config("trainer.prestart=false")
    assert prestart.begin(cfg) == {"servers": 0, "agent_workers": 0}
    assert OmegaConf.select(cfg, MANAGER_KEY, default=None) is None
    assert prestart.release() == []


def test_a_server_is_handed_over_only_to_a_replica_with_its_arguments(local_ray) -> None:
    import ray
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.verl.cpu.rollout import server_actor_name

    cfg = _config()
    try:
        assert prestart.begin(cfg) == {"servers": 1, "agent_workers": 1}
        assert OmegaConf.select(cfg, MANAGER_KEY) == prestart.MANAGER_CLASS  # verl will build our manager
        node = ray.get_runtime_context().get_node_id()
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # what verl's replica holds
        name = server_actor_name(0)
        other = prestart.server_key(rollout, cfg.actor_rollout_ref.model, RolloutMode.COLOCATED, 0, node)
        assert prestart.take_server(name, other) is None  # another mode: stopped, the replica starts its own
        assert prestart.take_server(name, other) is None  # and it is gone
        with pytest.raises(ValueError):
            ray.get_actor(name)
        # the agent-loop worker: imported, waiting for verl's arguments
        workers = prestart.take_agent_workers(1)
        assert workers is not None and len(workers) == 1
        assert prestart.take_agent_workers(1) is None  # taken once
        ray.kill(workers[0])
    finally:
        prestart.release()


def test_a_matching_server_serves_and_the_rest_is_released(local_ray) -> None:
    import ray
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.verl.cpu.rollout import server_actor_name

    cfg = _config()
    try:
        prestart.begin(cfg)
        node = ray.get_runtime_context().get_node_id()
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        key = prestart.server_key(rollout, cfg.actor_rollout_ref.model, RolloutMode.HYBRID, 0, node)
        server = prestart.take_server(server_actor_name(0), key)
        assert server is not None
        assert ray.get(server.status.remote())["global_steps"] is None  # up, the model loaded, no weights synced
        ray.kill(server)
    finally:
        left = prestart.release()
    assert left == ["agent-loop worker 0"]  # nobody took the worker: stopped with the run's start


def test_a_server_the_training_worker_hosts_is_not_prestarted(local_ray) -> None:
    """``trainer.rollout_server=worker`` builds the server inside the training worker once its model is loaded
    (agentevolver/verl/cpu/hosting.py): there is no server process to start early, only the agent-loop worker."""
    try:
        assert prestart.begin(_config("trainer.rollout_server=worker")) == {"servers": 0, "agent_workers": 1}
    finally:
        assert prestart.release() == ["agent-loop worker 0"]
