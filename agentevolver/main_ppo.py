"""Training entry: ``python -m agentevolver.main_ppo [--config-name PRESET] [overrides ...]``.

Hydra composes the root config (``config/agentevolver.yaml``: verl's ``ppo_trainer`` plus this project's
sections) or a preset from ``examples/`` (``--config-name quickstart``). This module validates our
sections (every problem named at once), resolves the model path (built-in names such as ``tiny-test``
work) and the rollout dump folder, and hands over to verl's ``run_ppo`` with
our :class:`~agentevolver.verl.task_runner.TaskRunner`: ``ray.init`` -> the TaskRunner (in this process, or an
actor: ``trainer.task_runner``) -> workers, rollout servers, agent loops -> ``fit()``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from agentevolver.config import validate_config
from agentevolver.errors import AgentEvolverError, ConfigError
from agentevolver.finished_run import finished_message

__all__ = ["check_verl_patches", "main", "prepare_config", "quiet_console", "train"]

logger = logging.getLogger(__name__)


def prepare_config(cfg: DictConfig) -> DictConfig:
    """Validate our sections and fill the derived verl keys (in place; returns ``cfg``)."""
    from agentevolver.models import resolve_model_path
    from agentevolver.module.agent_flow.dump import rollout_dump_dir
    from agentevolver.module.agent_flow.plugins import plugin_name_errors
    from agentevolver.verl.cpu.hosting import hosts_rollout_server
    from agentevolver.verl.driver_runner import runs_in_driver
    from agentevolver.verl.in_process import runs_in_process

    settings = validate_config(cfg, checks=(plugin_name_errors,))
    _check_loggers(cfg.trainer.get("logger"))
    _one_adca_switch(cfg)
    _check_stages(cfg, settings)
    _check_lora(cfg)
    _check_async(cfg)
    _check_reward_workers(cfg)
    _choose_request_router(cfg)
    _resolve_compute_dtypes(cfg)
    _resolve_worker_threads(cfg)
    _runtime_env_vars_as_text(cfg)
    _resolve_allocator(cfg)
    _resolve_mkl_cpu(cfg)
    _join_running_cluster(cfg)
    runs_in_driver(cfg)  # trainer.task_runner names a choice: said before Ray starts
    runs_in_process(cfg)  # trainer.agent_loop_workers too, and in_process only where it can run
    hosts_rollout_server(cfg)  # trainer.rollout_server too, and worker only where it can run
    with open_dict(cfg):
        cfg.actor_rollout_ref.model.path = str(resolve_model_path(str(cfg.actor_rollout_ref.model.path)))
        # Absolute here: the TaskRunner and workers may run on other nodes, in other working directories.
        cfg.trainer.default_local_dir = str(Path(str(cfg.trainer.default_local_dir)).expanduser().absolute())
        cfg.agent_flow.dump.dir = str(rollout_dump_dir(settings.agent_flow.dump.dir, str(cfg.trainer.default_local_dir)))
        # Ray actors need not share the driver's working directory: pin the task manager's files here.
        for key in ("synthetic_tasks_path", "checkpoint_path"):
            cfg.task_manager[key] = str(Path(str(cfg.task_manager[key])).expanduser().resolve())
        if settings.agent_program.callable is not None:
            from agentevolver.gateway.program import resolve_program_paths

            cfg.agent_program.callable = resolve_program_paths(settings.agent_program.callable)
    return cfg


def _resolve_compute_dtypes(cfg: DictConfig) -> None:
    """``auto`` compute dtypes (the CPU backend's default) become bf16 or fp32 by the CPU's flags and a measured
    bf16 speed-up, before verl reads them; ``auto`` is the CPU backend's value, so another device names its
    dtype."""
    from agentevolver.backends.cpu.precision import (
        AUTO,
        AUTO_DTYPE_KEYS,
        MIN_BF16_SPEEDUP,
        bf16_speedup,
        cpu_bf16_support,
        resolve_auto_dtypes,
    )

    device = str(OmegaConf.select(cfg, "trainer.device", default="cuda"))
    if device != "cpu":
        auto = [key for key in AUTO_DTYPE_KEYS if OmegaConf.select(cfg, key, default=None) == AUTO]
        if auto:
            raise ConfigError(f"{auto[0]}: 'auto' picks a dtype by measuring this CPU, so it needs "
                              f"trainer.device=cpu (here {device}); set bf16 or fp32")
        return
    chosen = resolve_auto_dtypes(cfg)
    if chosen:
        support = cpu_bf16_support()
        why = "no bf16 units on this CPU"
        if support:
            speedup = bf16_speedup()
            why = (f"the CPU has {support}; bf16 matrix products ran {speedup:.2f}x fp32's speed here, "
                   f"bf16 needs >= {MIN_BF16_SPEEDUP}x")
        print(f"[agentevolver] compute dtype: {'/'.join(sorted(set(chosen.values())))} ({why}; "
              f"set the dtype keys to fp32 or bf16 to choose)", file=sys.stderr)


def _resolve_worker_threads(cfg: DictConfig) -> None:
    """``auto`` torch threads for the Ray workers (the CPU preset's) become the usable cores, before ray.init;
    half of them each in async training, where the rollout server and the update compute side by side. The
    ``auto`` OpenMP wait policy is resolved with them."""
    from agentevolver.backends.cpu.threads import resolve_auto_threads, resolve_wait_policy
    from agentevolver.verl.async_loop import async_settings

    resolve_auto_threads(cfg, side_by_side=1 if async_settings(cfg) is None else 2)
    resolve_wait_policy(cfg)


def _resolve_allocator(cfg: DictConfig) -> None:
    """The memory allocator the config names (the CPU preset's ``AGENTEVOLVER_ALLOCATOR``) becomes the variables
    that select it, in the runtime env and in this process's environment, before ray.init starts anything."""
    from agentevolver.backends.cpu.allocator import resolve_allocator

    resolve_allocator(cfg)


def _resolve_mkl_cpu(cfg: DictConfig) -> None:
    """MKL's kernels on an AMD CPU (the CPU preset's ``AGENTEVOLVER_MKL_CPU``): after the compute dtypes and the
    allocator, before ray.init, since a preload only reaches processes started afterwards."""
    from agentevolver.backends.cpu.mkl_cpu import resolve_mkl_cpu

    resolve_mkl_cpu(cfg)


def _runtime_env_vars_as_text(cfg: DictConfig) -> None:
    """Ray takes only strings as runtime-env variables and fails inside ``ray.init`` with a traceback otherwise;
    Hydra reads ``...env_vars.X=2`` as a number. Numbers and booleans become their text here; anything else
    is named."""
    key = "ray_kwargs.ray_init.runtime_env.env_vars"
    env_vars = OmegaConf.select(cfg, key, default=None)
    if env_vars is None:
        return
    if not isinstance(env_vars, DictConfig):
        raise ConfigError(f"{key}: must be a mapping of variable names to values; got {env_vars!r}")
    with open_dict(cfg):
        for name, value in env_vars.items():
            if isinstance(value, bool):
                env_vars[name] = "true" if value else "false"
            elif isinstance(value, int | float):
                env_vars[name] = str(value)
            elif not isinstance(value, str):
                raise ConfigError(f"{key}.{name}: must be a string, number or boolean; got {value!r}")


def _one_adca_switch(cfg: DictConfig) -> None:
    """ADCA's switch is ``algorithm.adv_estimator=adca_grpo``; the old one (``attribution_driven_credit_assignment
    .enable=true`` with GRPO) still works: it becomes the new one, with a one-line notice."""
    from agentevolver.config.estimators import ADCA_ESTIMATOR, in_family

    section = cfg.get("attribution_driven_credit_assignment") or {}
    if section.get("enable", False) and in_family(cfg.algorithm.adv_estimator, "plain_grpo"):
        print(f"[agentevolver] notice: attribution_driven_credit_assignment.enable=true is the old switch of ADCA; "
              f"it is algorithm.adv_estimator={ADCA_ESTIMATOR} now (set that instead; same training)", file=sys.stderr)
        with open_dict(cfg):
            cfg.algorithm.adv_estimator = ADCA_ESTIMATOR


def _check_stages(cfg: DictConfig, settings: object) -> None:
    """What the trainer's stages refuse (e.g. a multi-sample context manager with GAE), here on the driver."""
    import warnings

    from verl.trainer.ppo.utils import need_critic

    from agentevolver.verl.step.trainer import check_stages

    with warnings.catch_warnings():  # verl warns that GRPO needs no critic; it says so again in the run
        warnings.simplefilter("ignore")
        use_critic = need_critic(cfg)
    check_stages(cfg, settings, use_critic=use_critic)


def _check_lora(cfg: DictConfig) -> None:
    """LoRA settings verl would fail on inside a worker, or not apply, stop here (agentevolver/verl/cpu/lora.py)."""
    from agentevolver.verl.cpu.lora import check_lora

    check_lora(cfg)


def _check_async(cfg: DictConfig) -> None:
    """``trainer.mode`` / ``trainer.max_staleness`` that cannot run stop here (agentevolver/verl/async_loop.py)."""
    from agentevolver.verl.async_loop import check_async

    check_async(cfg)


def _check_reward_workers(cfg: DictConfig) -> None:
    """``reward.num_workers: 0`` (the CPU preset) leaves out verl's reward-loop workers. Our agent loop scores
    every episode (every task row names it: agentevolver/verl/task_dataset.py), so they would only serve a reward
    model, which then needs at least one."""
    if int(OmegaConf.select(cfg, "reward.num_workers", default=1) or 0) > 0:
        return
    if bool(OmegaConf.select(cfg, "reward.reward_model.enable", default=False)):
        raise ConfigError("reward.num_workers: 0 starts no reward-loop worker, but reward.reward_model.enable is "
                          "true and the reward model is served by them; set reward.num_workers=1 or more")


def _choose_request_router(cfg: DictConfig) -> None:
    """``trainer.request_router: light`` points verl's ``rollout.router_config_path`` at our router, which routes
    as verl's balancer does without importing verl (agentevolver/verl/router.py), unless the run names a router
    of its own or asks for ``rollout.full_determinism``."""
    from agentevolver.verl.router import ROUTER_YAML

    choice = str(OmegaConf.select(cfg, "trainer.request_router", default="light"))
    if choice not in ("light", "verl"):
        raise ConfigError(f"trainer.request_router: must be light or verl; got {choice!r}")
    rollout = cfg.actor_rollout_ref.rollout
    if choice == "light" and not rollout.get("router_config_path") and not rollout.get("full_determinism", False):
        with open_dict(cfg):
            rollout.router_config_path = str(ROUTER_YAML)


def _join_running_cluster(cfg: DictConfig) -> None:
    """Joining a running Ray cluster (several nodes): the preset's local Ray sizes are left out, which Ray refuses
    there (agentevolver/verl/cluster.py)."""
    from agentevolver.verl.cluster import drop_local_ray_sizes

    dropped = drop_local_ray_sizes(cfg)
    if dropped:
        print(f"[agentevolver] joining the Ray cluster at {dropped['address']}: its nodes declared their own CPUs and "
              f"GPUs, so {', '.join(dropped['keys'])} (settings of a local Ray) are left out", file=sys.stderr)


def _check_loggers(value: object) -> None:
    """``trainer.logger`` names only backends that exist (verl's would fail later, inside a Ray actor)."""
    from verl.utils.tracking import Tracking

    from agentevolver.verl.tracking import OWN_BACKENDS, logger_names

    known = [*OWN_BACKENDS, *Tracking.supported_backend]
    unknown = [name for name in logger_names(value) if name not in known]
    if unknown:
        raise ConfigError(f"trainer.logger: unknown backend(s) {unknown}; choose from {known}")


def check_verl_patches() -> None:
    """Every guard of :mod:`agentevolver.verl.patches`, here on the driver before Ray starts: a verl that no
    longer matches a patch stops the run with the verl version and the patch named."""
    from agentevolver.verl import patches
    from agentevolver.verl.cpu import platform as cpu_platform

    try:
        patches.check_all(cpu=cpu_platform.selected())
    except patches.VerlChangedError as err:
        raise ConfigError(str(err)) from err


def train(cfg: DictConfig) -> None:
    """Run one training job (blocking)."""
    from verl.trainer.main_ppo import run_ppo

    from agentevolver.verl.cluster import pin_to_driver_node
    from agentevolver.verl.driver_runner import InDriver, runs_in_driver, runtime_env_vars
    from agentevolver.verl.task_runner import TaskRunner, TaskRunnerActor

    cfg = prepare_config(cfg)
    finished = finished_message(cfg)
    if finished is not None:  # a finished run started again: say so instead of training a step past the end
        print(f"[agentevolver] {finished}", file=sys.stderr)
        return
    check_verl_patches()
    quiet_console(cfg)
    if runs_in_driver(cfg):  # the driver has imported the stack already: no process of its own to start
        run_ppo(cfg, task_runner_class=InDriver(TaskRunner, runtime_env_vars(cfg)))
    else:  # it writes the run folder: the driver's node
        run_ppo(cfg, task_runner_class=pin_to_driver_node(TaskRunnerActor))


def quiet_console(cfg: DictConfig) -> None:
    """Once the config is known to be good: the full console output goes to
    ``<trainer.default_local_dir>/console.log`` (:mod:`agentevolver.console`; ``--verbose`` shows all)."""
    from agentevolver import console

    log = console.attach(Path(str(cfg.trainer.default_local_dir)) / "console.log")
    if log is not None:
        print(f"[agentevolver] full console output: {log} (--verbose shows it here)", file=sys.stderr)


@hydra.main(config_path=None, config_name="agentevolver", version_base=None)
def main(cfg: DictConfig) -> None:
    from agentevolver import console

    console.install()  # the progress bar, the step table, validation lines and actionable warnings on screen
    try:
        train(cfg)
    except AgentEvolverError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except Exception as err:  # a start-up check inside the TaskRunner actor arrives wrapped by Ray
        cause = getattr(err, "cause", None)
        if isinstance(cause, AgentEvolverError):
            print(f"error: {cause}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    from agentevolver.config.reference_check import check_hydra_argv
    from agentevolver.console import VERBOSE_ENV

    if "--verbose" in sys.argv:  # ours, not Hydra's: show every line of every process
        sys.argv.remove("--verbose")
        os.environ[VERBOSE_ENV] = "1"

    try:  # a reference AgentEvolver preset would fail inside Hydra: name its old keys and their new names
        check_hydra_argv(sys.argv[1:])
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
