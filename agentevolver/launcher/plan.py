"""What a launch will do, decided before anything starts: config, services, record folder, training command.

Building the plan composes and validates the config exactly as the trainer will (so a bad key stops the
launch before any process starts) and resolves every service; ``--dry-run`` prints it and stops there.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from agentevolver.backends.cpu.allocator import configured_env
from agentevolver.config import AgentEvolverSettings, load_config
from agentevolver.errors import ConfigError
from agentevolver.launcher.record import CONFIG_NAME
from agentevolver.launcher.services import ServicePlan, plan_service, port_in_use, probe
from agentevolver.module.agent_flow.plugins import plugin_name_errors

__all__ = ["DEFAULT_TARGET", "LaunchPlan", "build_plan", "print_plan", "split_overrides"]

#: The training entry the launcher runs (a Hydra app taking --config-path / --config-name).
DEFAULT_TARGET = "agentevolver.main_ppo"

#: Short flags for the built-in services (``--with-memory`` = ``--with memory``).
BUILT_IN_SERVICES = ("env", "memory", "logview", "llm")


@dataclass
class LaunchPlan:
    """Everything a launch does, resolved."""

    conf: Path
    overrides: list[str]
    hydra_overrides: list[str]
    experiment: str
    record_dir: Path
    target: str
    services: list[ServicePlan]
    training_argv: list[str] = field(default_factory=list)
    #: Variables every process the launcher starts gets (the run's memory allocator; none when it names none).
    process_env: dict[str, str] = field(default_factory=dict)


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """Config overrides (composed into the recorded config) and ``hydra.*`` / ``hydra/...`` ones (which
    configure Hydra itself, so they are passed on to the training command instead)."""
    config, hydra = [], []
    for item in overrides:
        (hydra if item.lstrip("+~").startswith(("hydra.", "hydra/")) else config).append(item)
    return config, hydra


def _conf_location(conf: Path) -> tuple[Path, str]:
    """``examples/quickstart.yaml`` -> (``examples/``, ``quickstart``): Hydra's config dir and name."""
    if conf.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--conf {str(conf)!r}: expected a .yaml file (e.g. examples/quickstart.yaml)")
    if not conf.is_file():
        raise ConfigError(f"--conf {str(conf)!r}: no such file")
    return conf.resolve().parent, conf.stem


def _experiment_name(cfg: DictConfig) -> str:
    name = str(cfg.trainer.experiment_name)
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ConfigError(f"trainer.experiment_name: names the run record folder, so it must be a plain "
                          f"folder name without '/'; got {name!r}")
    return name


def build_plan(conf: Path, overrides: list[str], services: list[str], envs: str | None,
               target: str = DEFAULT_TARGET) -> tuple[LaunchPlan, DictConfig, AgentEvolverSettings]:
    """Compose the run's config and resolve the selected ``services`` (names in ``launcher.services``).

    ``envs``: the names given to ``--with-env`` ("" when it was given bare; None when not given).
    """
    config_dir, config_name = _conf_location(conf)
    config_overrides, hydra_overrides = split_overrides(overrides)
    cfg, settings = load_config(config_overrides, config_name=config_name, config_dir=config_dir,
                                checks=(plugin_name_errors,))
    experiment = _experiment_name(cfg)
    env_type = settings.env_service.env_type
    if envs:
        served = [name.strip() for name in envs.split(",") if name.strip()]
        if env_type not in served:
            raise ConfigError(
                f"--with-env {envs}: the training run uses env_service.env_type={env_type!r}, which this "
                f"service would not serve; add it (--with-env {','.join([*served, env_type])}) or set "
                f"env_service.env_type after `--`"
            )
    known = settings.launcher.services
    unknown = [name for name in services if name not in known]
    if unknown:
        raise ConfigError(f"--with {unknown[0]}: no service launcher.services.{unknown[0]}; defined: "
                          f"{', '.join(known) or 'none'}")
    ordered = [name for name in known if name in services]  # the config's order, each once
    plans = [plan_service(name, known[name], envs=envs or env_type) for name in ordered]
    _check_distinct_addresses(plans)
    record_dir = Path(settings.launcher.record_dir) / experiment
    plan = LaunchPlan(conf=conf, overrides=config_overrides, hydra_overrides=hydra_overrides,
                      experiment=experiment, record_dir=record_dir.resolve(), target=target, services=plans)
    plan.training_argv = training_argv(plan)
    plan.process_env = configured_env(cfg)
    return plan, cfg, settings


def training_argv(plan: LaunchPlan) -> list[str]:
    """``python -m <target> --config-path <record> --config-name config`` (+ Hydra's own overrides)."""
    argv = [sys.executable, "-m", plan.target, "--config-path", str(plan.record_dir), "--config-name", CONFIG_NAME]
    if not any(item.lstrip("+").startswith("hydra.run.dir=") for item in plan.hydra_overrides):
        argv.append(f"hydra.run.dir={plan.record_dir / 'hydra'}")
    return argv + plan.hydra_overrides


def _check_distinct_addresses(plans: list[ServicePlan]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for plan in plans:
        other = seen.setdefault((plan.host, plan.port), plan.name)
        if other != plan.name:
            raise ConfigError(f"launcher.services.{plan.name}.url and launcher.services.{other}.url both use "
                              f"{plan.host}:{plan.port}; give each service its own port")


def print_plan(plan: LaunchPlan, console: Console, probe_timeout_s: float) -> None:
    """The ``--dry-run`` report: each service with what the launcher would do, then the training command.

    Probing health is read-only, so the report can say which services would be reused.
    """
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    with httpx.Client(timeout=probe_timeout_s) as client:
        for svc in plan.services:
            if probe(client, svc.health_url) is None:
                action = "reuse (already healthy; it will not be started or stopped)"
            elif port_in_use(svc.host, svc.port):
                action = "FAIL: the port is taken by a program that does not answer the health URL"
            else:
                action = "start"
            grid.add_row(f"service {svc.name}", action)
            grid.add_row("  listens on", f"{svc.host}:{svc.port}  (health {svc.health_url}, "
                                         f"ready within {svc.ready_timeout_s:g} s)")
            grid.add_row("  command", shlex.join(svc.argv))
            grid.add_row("  log", str(plan.record_dir / "logs" / svc.log_file))
    if not plan.services:
        grid.add_row("services", "none selected (--with-env, --with-memory, --with-logview, --with-llm, --with NAME)")
    grid.add_row("record", str(plan.record_dir))
    if plan.overrides:
        grid.add_row("overrides", shlex.join(plan.overrides) + "  (composed into the recorded config)")
    grid.add_row("training", shlex.join(plan.training_argv))
    if plan.process_env:
        grid.add_row("environment", " ".join(f"{k}={v}" for k, v in plan.process_env.items())
                     + "  (every process started)")
    console.print(f"[bold]launch plan for experiment {plan.experiment!r}[/bold] (--dry-run: nothing started)")
    console.print(grid)
