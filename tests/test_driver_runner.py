"""verl's TaskRunner in the driver's process (agentevolver/verl/driver_runner.py), through verl's own run_ppo.

The training runs of the suite run this way (``trainer.task_runner=auto``); tests/test_main_ppo.py's attributed
run trains with ``trainer.task_runner=actor`` (verl's TaskRunner actor)."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf, open_dict

from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.verl.driver_runner import InDriver, runs_in_driver, runtime_env_vars


def _config(*overrides: str):
    return compose_config(overrides=list(overrides))


@pytest.mark.parametrize(("overrides", "environ", "expected"), [
    ([], {}, True),
    (["trainer.task_runner=actor"], {}, False),
    (["trainer.task_runner=driver", "+ray_kwargs.ray_init.address=ray://head:10001"], {}, True),
    (["+ray_kwargs.ray_init.address=ray://head:10001"], {}, False),  # a Ray Client: the driver is outside
    (["+ray_kwargs.ray_init.address=10.0.0.5:6379"], {}, True),  # a cluster node's driver: in it
    ([], {"RAY_ADDRESS": "ray://head:10001"}, False),
])
def test_auto_runs_in_the_driver_except_for_a_ray_client(overrides, environ, expected, monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert runs_in_driver(_config(*overrides)) is expected


def test_an_unknown_choice_is_named() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.task_runner: must be one of auto, driver, actor; got 'elsewhere'"):
        runs_in_driver(_config("trainer.task_runner=elsewhere"))


def test_the_runtime_env_holds_verls_variables_and_the_configs() -> None:
    from verl.trainer.constants_ppo import PPO_RAY_RUNTIME_ENV

    env = runtime_env_vars(_config("backend=cpu"))
    assert env["VERL_PLATFORM"] == "cpu"  # the CPU preset's
    for name, value in PPO_RAY_RUNTIME_ENV["env_vars"].items():  # verl's, unless this process has them already
        assert env.get(name) == value or name in os.environ
    assert all(isinstance(value, str) for value in env.values())


class _Body:
    """A TaskRunner body that reports where it ran and what it saw."""

    def run(self, config) -> dict:
        return {"pid": os.getpid(), "marker": os.environ.get("AGENTEVOLVER_TEST_MARKER"),
                "steps": int(config.trainer.total_training_steps)}


def test_verls_run_ppo_runs_the_body_in_this_process_with_the_runtime_env(monkeypatch) -> None:
    """verl's ``run_ppo`` calls ``.remote()`` and ``ray.get(runner.run.remote(config))``: the body runs here, after
    ``ray.init``, with the runtime env's variables set, and what it returns is what ``ray.get`` gets."""
    import ray
    from verl.trainer.main_ppo import run_ppo

    monkeypatch.delenv("AGENTEVOLVER_TEST_MARKER", raising=False)
    cfg = _config("trainer.total_training_steps=3")
    with open_dict(cfg):
        cfg.ray_kwargs.ray_init = OmegaConf.create({"num_cpus": 1, "include_dashboard": False})
    seen: list[dict] = []

    class Recording(_Body):
        def run(self, config) -> dict:
            assert ray.is_initialized()  # run_ppo started Ray first
            seen.append(super().run(config))
            return seen[-1]

    try:
        run_ppo(cfg, task_runner_class=InDriver(Recording, {"AGENTEVOLVER_TEST_MARKER": "set"}))
    finally:
        ray.shutdown()
        os.environ.pop("AGENTEVOLVER_TEST_MARKER", None)
    assert seen == [{"pid": os.getpid(), "marker": "set", "steps": 3}]


def test_a_failure_in_the_body_reaches_the_caller_as_itself() -> None:
    """In the driver, a start-up check's error is raised as itself (an actor's arrives wrapped by Ray)."""

    class Failing(_Body):
        def run(self, config) -> dict:
            raise ConfigError("data.train_files: no such file")

    runner = InDriver(Failing, {}).options(runtime_env={}).remote()
    with pytest.raises(ConfigError, match="no such file"):
        runner.run.remote(_config())
