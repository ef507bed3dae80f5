"""The runs of an ablation (arm x seed), each a launcher command, composed and checked before any starts.

A run is ``python -m agentevolver.launcher --conf PRESET --with-... -- OVERRIDES``: a normal launch, whose
run folder is ``<out>/runs/<arm>/seed<k>`` and whose launcher record is ``<out>/records/<experiment>``.
Composing every run's config up front (the launcher's own :func:`~agentevolver.launcher.plan.build_plan`)
finds a bad override of any arm before the first run trains, and gives what the report needs: the number
of steps, the source of each role (policy, environment, LLM roles) and the budget keys.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from agentevolver.config import AgentEvolverSettings
from agentevolver.errors import ConfigError
from agentevolver.experiments.records import VALIDATION_DIR
from agentevolver.experiments.spec import AblationSpec, ResolvedArm
from agentevolver.launcher.plan import BUILT_IN_SERVICES, build_plan
from agentevolver.launcher.services import fill_placeholders
from agentevolver.module.adv_processor.stage import adca_on

__all__ = ["HOLD_TARGET", "AblationPlan", "RunPlan", "compose_runs", "plan_ablation", "run_roles", "service_flags"]

#: The launcher target of the services launch: holds the services until the ablation ends.
HOLD_TARGET = "agentevolver.experiments.hold"

#: Keys the runner sets on every run (after every other override). ``trainer.validation_data_dir`` turns on verl's
#: per-sample validation dump in the run folder: the report's per-task records (:mod:`.records`).
RUNNER_KEYS = ("trainer.experiment_name", "trainer.default_local_dir", "launcher.record_dir", "trainer.resume_mode",
               "trainer.validation_data_dir")


@dataclass
class RunPlan:
    """One training run of the ablation."""

    arm: str
    seed: int
    experiment: str
    conf: Path
    run_dir: Path
    services: list[str]
    overrides: list[str]
    argv: list[str]
    # From the composed config (compose_runs):
    total_steps: int | None = None
    roles: dict[str, str] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    health_urls: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.arm}/seed{self.seed}"

    def to_json(self) -> dict[str, Any]:
        return {"arm": self.arm, "seed": self.seed, "experiment": self.experiment, "conf": str(self.conf),
                "run_dir": str(self.run_dir),
                "services": self.services, "overrides": self.overrides, "argv": self.argv,
                "total_steps": self.total_steps, "roles": self.roles, "budget": self.budget}


@dataclass
class AblationPlan:
    """Everything the ablation will run, resolved."""

    spec: AblationSpec
    spec_path: Path
    out: Path
    arms: list[ResolvedArm]
    seeds: list[int]
    cli_overrides: list[str]
    services: list[str]
    runs: list[RunPlan]
    hold_experiment: str
    hold_argv: list[str]
    hold_health_urls: dict[str, str] = field(default_factory=dict)

    @property
    def records(self) -> Path:
        return self.out / "records"

    @property
    def hold_record(self) -> Path:
        return self.records / self.hold_experiment

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.model_dump(mode="json"), "spec_path": str(self.spec_path), "out": str(self.out),
                "arms": [arm.model_dump() for arm in self.arms], "seeds": self.seeds,
                "cli_overrides": self.cli_overrides, "services": self.services,
                "hold_experiment": self.hold_experiment, "hold_argv": self.hold_argv,
                "runs": [run.to_json() for run in self.runs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AblationPlan:
        """The plan as :meth:`to_json` wrote it into ``<out>/ablation.json`` (no config is composed)."""
        runs = [RunPlan(arm=r["arm"], seed=r["seed"], experiment=r["experiment"], conf=Path(r["conf"]),
                        run_dir=Path(r["run_dir"]), services=r["services"], overrides=r["overrides"], argv=r["argv"],
                        total_steps=r["total_steps"], roles=r["roles"], budget=r["budget"]) for r in data["runs"]]
        return cls(spec=AblationSpec.model_validate(data["spec"]), spec_path=Path(data["spec_path"]),
                   out=Path(data["out"]), arms=[ResolvedArm.model_validate(a) for a in data["arms"]],
                   seeds=list(data["seeds"]), cli_overrides=list(data["cli_overrides"]),
                   services=list(data["services"]), runs=runs, hold_experiment=data["hold_experiment"],
                   hold_argv=list(data["hold_argv"]))

    def budget_differences(self) -> dict[str, dict[str, Any]]:
        """Budget keys whose value differs between arms: key -> {arm: value}."""
        differ: dict[str, dict[str, Any]] = {}
        for key in self.spec.budget_keys:
            values = {run.arm: run.budget.get(key) for run in self.runs}
            if len({repr(value) for value in values.values()}) > 1:
                differ[key] = values
        return differ


def service_flags(names: list[str]) -> list[str]:
    """Launcher flags that select ``names`` (``--with-env`` for the built-ins, ``--with NAME`` otherwise)."""
    flags: list[str] = []
    for name in names:
        flags += [f"--with-{name}"] if name in BUILT_IN_SERVICES else ["--with", name]
    return flags


def _launcher_argv(conf: Path, services: list[str], overrides: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "agentevolver.launcher", "--conf", str(conf), *service_flags(services), *extra,
            "--", *overrides]


def plan_ablation(spec: AblationSpec, spec_path: Path, arms: list[ResolvedArm], seeds: list[int], out: Path,
                  cli_overrides: list[str]) -> AblationPlan:
    """The runs in order (arm by arm, seed by seed) with their launcher commands; nothing composed yet."""
    out = out.resolve()
    records = out / "records"
    runs: list[RunPlan] = []
    for arm in arms:
        services = list(dict.fromkeys([*spec.services, *arm.services]))
        for seed in seeds:
            experiment = f"{spec.name}-{arm.name}-seed{seed}"
            run_dir = out / "runs" / arm.name / f"seed{seed}"
            values = {"seed": str(seed), "run_dir": str(run_dir), "arm": arm.name, "experiment": experiment}
            overrides = [
                *spec.overrides, *arm.overrides,
                *fill_placeholders(spec.seed_overrides, values, "seed_overrides"),
                *fill_placeholders(spec.run_overrides, values, "run_overrides"),
                *cli_overrides,
                f"trainer.experiment_name={experiment}", f"trainer.default_local_dir={run_dir}",
                f"launcher.record_dir={records}", "trainer.resume_mode=auto",
                f"trainer.validation_data_dir={run_dir / VALIDATION_DIR}",
            ]
            runs.append(RunPlan(arm=arm.name, seed=seed, experiment=experiment, conf=spec.conf, run_dir=run_dir,
                                services=services,
                                overrides=overrides, argv=_launcher_argv(spec.conf, services, overrides)))
    every_service = list(dict.fromkeys(name for run in runs for name in run.services))
    hold_experiment = f"{spec.name}-services"
    hold_overrides = [*spec.overrides, *cli_overrides, f"trainer.experiment_name={hold_experiment}",
                      f"launcher.record_dir={records}"]
    hold_argv = _launcher_argv(spec.conf, every_service, hold_overrides, "--target", HOLD_TARGET)
    return AblationPlan(spec=spec, spec_path=spec_path.resolve(), out=out, arms=arms, seeds=seeds,
                        cli_overrides=cli_overrides, services=every_service, runs=runs,
                        hold_experiment=hold_experiment, hold_argv=hold_argv)


def compose_runs(plan: AblationPlan) -> None:
    """Compose and validate every run's config as its launch will (a bad override stops here, naming the run),
    fill in each run's steps, roles, budget and service addresses, and check that every run reaches its
    services where the shared services launch starts them."""
    if plan.services:
        hold_overrides = plan.hold_argv[plan.hold_argv.index("--") + 1:]
        try:
            hold, _cfg, _settings = build_plan(plan.spec.conf, hold_overrides, plan.services,
                                               "" if "env" in plan.services else None, HOLD_TARGET)
        except ConfigError as err:
            raise ConfigError(f"the shared services launch: {err}") from err
        plan.hold_health_urls = {svc.name: svc.health_url for svc in hold.services}
    for run in plan.runs:
        try:
            launch, cfg, settings = build_plan(plan.spec.conf, run.overrides, run.services,
                                               "" if "env" in run.services else None)
        except ConfigError as err:
            raise ConfigError(f"run {run.key} (arm {run.arm!r}): {err}") from err
        steps = OmegaConf.select(cfg, "trainer.total_training_steps")
        run.total_steps = int(steps) if isinstance(steps, int) and steps > 0 else None
        if OmegaConf.select(cfg, "trainer.val_only", default=False):
            run.total_steps = 0                   # a validation-only run is done once its step-0 line is there
        run.roles = run_roles(cfg, settings)
        run.budget = {key: _plain(OmegaConf.select(cfg, key, default=None)) for key in plan.spec.budget_keys}
        run.health_urls = {svc.name: svc.health_url for svc in launch.services}
        for name, url in run.health_urls.items():
            shared = plan.hold_health_urls.get(name)
            if shared is not None and shared != url:
                raise ConfigError(
                    f"run {run.key}: its {name!r} service would be at {url}, the shared one is at {shared}; "
                    f"services are started once for the whole ablation, so an arm must not change their "
                    f"addresses (launcher.services.{name}.url or the key it comes from)")


def _synthetic_grader(settings: AgentEvolverSettings) -> str:
    """``task_manager.grader.synthetic_grader`` with ``auto`` resolved as the task manager resolves it."""
    from agentevolver.module.task_manager.profile import resolve_synthetic_grader

    return resolve_synthetic_grader(settings.task_manager.grader.synthetic_grader, settings.env_service.env_type,
                                    settings.task_manager.env_profile)


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig) or OmegaConf.is_list(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


def run_roles(cfg: DictConfig, settings: AgentEvolverSettings) -> dict[str, str]:
    """Which source plays each role that is active in this run: the policy model, the environment, the
    graders, and each LLM role in use (its endpoint's model name and endpoint name)."""
    def llm(role: str) -> str:
        name, endpoint = settings.llm.endpoint_for(role)
        return f"{endpoint.model} ({name})"

    env = settings.env_service.env_type
    tm = settings.task_manager
    roles = {"policy": str(cfg.actor_rollout_ref.model.path), "env": env}
    roles["reward"] = f"env {env}" if tm.grader.original_grader == "env" else f"grader {tm.grader.original_grader}"
    if tm.n > 0:
        roles["task_explorer"] = llm("task_explorer")
        roles["task_summarizer"] = llm("task_summarizer") if tm.writer == "llm" else \
            f"env {env} (tasks rendered from the exploration's calls, code)"
        if "llm_feasibility" in tm.post_filters:
            roles["task_filter"] = llm("task_filter")
    if tm.mixture.synthetic_data_ratio > 0:
        grader = _synthetic_grader(settings)
        roles["synthetic_reward"] = llm("task_grader") if grader == "llm" else \
            f"answer matched to what env {env} proved (code)" if grader == "reference" else f"grader {grader}"
    adca = settings.attribution_driven_credit_assignment
    if adca_on(cfg.algorithm.adv_estimator, adca.enable):
        roles["judge"] = llm("judge") if adca.judge.source == "llm" else f"env {env} (step labels, code)"
    memory, exp = settings.memory, settings.exp_manager
    if memory.enable_summarizer or memory.enable_context_generator or exp.init_exp_before_training:
        roles["memory"] = f"memory service {memory.base_url} (workspace {memory.workspace_id})"
    if memory.enable_summarizer or exp.init_exp_before_training or memory.updated_freq > 0:
        roles["exp_summarizer"] = llm("exp_summarizer") if exp.experience_kind == "advice" else \
            "none: solved episodes stored whole as exemplars (no LLM)"
    if settings.agent_flow.context_template == "self_clip":
        roles["context_clipper"] = llm("context_clipper")
    return roles
