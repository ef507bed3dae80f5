"""Where verl's TaskRunner runs: in the driver's own process, or as a Ray actor (``trainer.task_runner``).

verl's ``run_ppo(config, task_runner_class)`` starts Ray, then calls ``task_runner_class.remote()`` and
``ray.get(runner.run.remote(config))``: the TaskRunner, which builds the workers and runs ``fit()``, is an actor
of its own. That actor is a fresh Python process that imports verl, torch and transformers again, while the
driver, which has imported them already, waits on it and does nothing else. Measured on a tiny-test run (2-core
AMD EPYC, docs/benchmarks.md "Fixed costs"): 6.4 s of its 36.8 s start-up go to that process.

:class:`InDriver` offers ``run_ppo`` the same two calls and runs the TaskRunner's body in this process instead.
Everything else stays as verl runs it: the actor/rollout workers, the rollout servers and the agent-loop
workers are Ray actors, placed by the same resource pools. The TaskRunner actor was pinned to the driver's node
already (:func:`~agentevolver.verl.cluster.pin_to_driver_node`: it writes the run folder), so in the driver it
runs where it ran. What the actor got from Ray and the driver lacks, the runtime environment's variables, is
set in this process first, and the root logger is put at the level an actor's has.

``auto`` keeps the actor only for a Ray Client address (``ray://``): there the driver is a machine outside the
cluster, and the TaskRunner's traffic with the workers belongs inside it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentevolver.errors import ConfigError
from agentevolver.verl.cluster import ray_address

__all__ = ["CHOICES", "InDriver", "runs_in_driver", "runtime_env_vars"]

#: The values of ``trainer.task_runner``.
CHOICES = ("auto", "driver", "actor")
#: ``ray.init`` addresses that make the driver a Ray Client, outside the cluster.
_CLIENT_PREFIX = "ray://"


def runs_in_driver(cfg: DictConfig) -> bool:
    """Whether this run's TaskRunner runs in the driver's process (``trainer.task_runner``; see the module)."""
    choice = str(OmegaConf.select(cfg, "trainer.task_runner", default="auto"))
    if choice not in CHOICES:
        raise ConfigError(f"trainer.task_runner: must be one of {', '.join(CHOICES)}; got {choice!r}")
    if choice != "auto":
        return choice == "driver"
    return not ray_address(cfg).startswith(_CLIENT_PREFIX)


def runtime_env_vars(cfg: DictConfig) -> dict[str, str]:
    """The variables Ray gives every actor of the run: verl's defaults merged with
    ``ray_kwargs.ray_init.runtime_env.env_vars``, as ``run_ppo`` composes them for ``ray.init``."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    ours = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    merged = {**get_ppo_ray_runtime_env(cfg).get("env_vars", {}), **OmegaConf.to_container(ours, resolve=True)}
    return {str(name): str(value) for name, value in merged.items()}


class _Method:
    """``runner.run.remote(config)``: runs it here and returns a finished object ref for ``ray.get``."""

    def __init__(self, function: Any) -> None:
        self._function = function

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.put(self._function(*args, **kwargs))


class _Runner:
    """What ``task_runner_class.remote()`` returns: the TaskRunner's methods, each callable with ``.remote``."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self._runner, name))


class InDriver:
    """A stand-in for a ``@ray.remote`` TaskRunner class that runs ``runner_class`` (a plain class) in this
    process: ``run_ppo(cfg, task_runner_class=InDriver(TaskRunner, runtime_env_vars(cfg)))``."""

    def __init__(self, runner_class: type, env_vars: dict[str, str]) -> None:
        self._runner_class = runner_class
        self._env_vars = env_vars

    def options(self, **_options: Any) -> InDriver:
        """Actor options (verl passes nsight's on CUDA): nothing to place, this process is the runner."""
        return self

    def remote(self) -> _Runner:
        os.environ.update(self._env_vars)  # what Ray would have given the actor, before its body runs
        # An actor's root logger is at Python's default, WARNING; Hydra set the driver's to INFO. The console
        # shows what it showed with the actor (the run's own INFO lines were never on it).
        logging.getLogger().setLevel(max(logging.getLogger().level, logging.WARNING))
        return _Runner(self._runner_class())
