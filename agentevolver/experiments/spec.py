"""The ablation file: which training preset, which arms, how many seeds, which shared services.

An arm is a named list of Hydra overrides applied on top of the training preset; ``include`` composes arms
(``all`` = the overrides of ``sq``, ``sn`` and ``sa`` in that order). Every run of the ablation gets, in
this order: the file's ``overrides`` (the shared budget), the arm's, the file's ``seed_overrides`` and
``run_overrides`` with ``{seed}``, ``{run_dir}``, ``{arm}``, ``{experiment}`` filled in, the command line's
overrides, then the four keys the runner owns (``trainer.experiment_name``, ``trainer.default_local_dir``,
``launcher.record_dir``, ``trainer.resume_mode``). docs/experiments.md describes the format.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentevolver.config import format_validation_error
from agentevolver.errors import ConfigError

__all__ = ["DEFAULT_BUDGET_KEYS", "AblationSpec", "ArmSpec", "ResolvedArm", "load_spec", "parse_arms"]

#: Config keys that make up a run's budget; the dry run and the report flag arms that change one.
DEFAULT_BUDGET_KEYS: tuple[str, ...] = (
    "trainer.total_training_steps", "data.train_batch_size", "actor_rollout_ref.rollout.n",
    "agent_flow.max_steps", "agent_flow.max_tokens_per_turn", "actor_rollout_ref.rollout.response_length",
    "env_service.val_split", "data.val_max_samples", "actor_rollout_ref.rollout.val_kwargs.n", "trainer.test_freq",
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArmSpec(_Model):
    """``arms.<name>``: one arm of the ablation."""

    description: str = ""
    # Hydra overrides of this arm (after the file's shared overrides).
    overrides: list[str] = Field(default_factory=list)
    # Launcher services this arm needs besides the file's `services` (env, memory, llm, or your own).
    services: list[str] = Field(default_factory=list)
    # Other arms whose overrides and services come first, in order (e.g. all = [sq, sn, sa]).
    include: list[str] = Field(default_factory=list)
    # The arm this one is compared with seed by seed in the report (default: the file's `baseline`), e.g.
    # sq against few when both train on the same few seed tasks.
    baseline: str | None = None


class AblationSpec(_Model):
    """The whole ablation file."""

    # Name of the ablation: the default report folder (ablations/<name>) and the runs' experiment names.
    name: str
    # The training preset every run starts from (relative paths are relative to the ablation file).
    conf: Path
    # Seeds per arm (0 .. seeds-1); --seeds overrides it.
    seeds: int = Field(default=1, ge=1)
    # Launcher services every run needs (started once for the whole ablation, shared by its runs).
    services: list[str] = Field(default_factory=list)
    # Hydra overrides of every run: the shared budget.
    overrides: list[str] = Field(default_factory=list)
    # Hydra overrides that seed a run; {seed} is the seed.
    seed_overrides: list[str] = Field(default_factory=list)
    # Hydra overrides per run; {run_dir}, {arm}, {seed}, {experiment} are filled in.
    run_overrides: list[str] = Field(default_factory=list)
    # Config keys that must be equal across arms for a fair comparison (checked, reported).
    budget_keys: list[str] = Field(default_factory=lambda: list(DEFAULT_BUDGET_KEYS))
    # The arm every other arm is compared with, seed by seed, in the report (null = no paired comparison
    # unless an arm names its own baseline).
    baseline: str | None = None
    # The arms, in report order.
    arms: dict[str, ArmSpec] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"must be a plain name (letters, digits, '_', '.', '-'); got {value!r}")
        return value

    @model_validator(mode="after")
    def _arms_are_consistent(self) -> AblationSpec:
        for name, arm in self.arms.items():
            if not _NAME.match(name):
                raise ValueError(f"arms.{name}: an arm name is a folder name (letters, digits, '_', '.', '-')")
            unknown = [other for other in arm.include if other not in self.arms]
            if unknown:
                raise ValueError(f"arms.{name}.include: no arm {unknown[0]!r}; arms: {', '.join(self.arms)}")
            if arm.baseline is not None and arm.baseline not in self.arms:
                raise ValueError(f"arms.{name}.baseline: no arm {arm.baseline!r}; arms: {', '.join(self.arms)}")
        if self.baseline is not None and self.baseline not in self.arms:
            raise ValueError(f"baseline: no arm {self.baseline!r}; arms: {', '.join(self.arms)}")
        for name in self.arms:
            self.resolve(name)  # raises on a cycle
        return self

    def resolve(self, name: str, _path: tuple[str, ...] = ()) -> ResolvedArm:
        """The arm with its includes expanded (their overrides first, in order)."""
        if name in _path:
            raise ValueError(f"arms.{name}.include: arms include each other ({' -> '.join([*_path, name])})")
        arm = self.arms[name]
        overrides: list[str] = []
        services: list[str] = []
        for other in arm.include:
            part = self.resolve(other, (*_path, name))
            overrides += part.overrides
            services += part.services
        overrides += arm.overrides
        services += arm.services
        baseline = arm.baseline if arm.baseline is not None else self.baseline
        return ResolvedArm(name=name, description=arm.description, overrides=overrides,
                           services=list(dict.fromkeys(services)), baseline=None if baseline == name else baseline)


class ResolvedArm(_Model):
    """An arm with its includes expanded."""

    name: str
    description: str
    overrides: list[str]
    services: list[str]
    #: The arm it is compared with seed by seed (None: the baseline itself, or no comparison).
    baseline: str | None = None


def load_spec(path: Path) -> AblationSpec:
    """Read and validate an ablation file; ``conf`` becomes an absolute path. Errors name the key."""
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"--conf {str(path)!r}: cannot read it ({err.strerror or err})") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"--conf {str(path)!r}: not valid YAML: {err}") from err
    if isinstance(data, dict) and "arms" not in data and "defaults" in data:
        raise ConfigError(
            f"--conf {str(path)!r} is a training preset, not an ablation file; give an ablation file whose "
            f"`conf:` names this preset (examples/ablation/quickstart.yaml is one; docs/experiments.md)")
    if not isinstance(data, dict):
        raise ConfigError(f"--conf {str(path)!r}: an ablation file is a YAML mapping with name, conf and arms")
    try:
        spec = AblationSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"ablation file {str(path)!r}: " + format_validation_error(err)) from err
    conf = spec.conf if spec.conf.is_absolute() else (path.resolve().parent / spec.conf)
    if not conf.is_file():
        raise ConfigError(f"ablation file {str(path)!r}: conf: no training preset at {str(conf)!r}")
    spec.conf = conf.resolve()
    return spec


def parse_arms(spec: AblationSpec, arms: str | None) -> list[ResolvedArm]:
    """``--arms grpo,sa`` -> those arms in that order (default: every arm of the file, in its order)."""
    names = [name.strip() for name in arms.split(",") if name.strip()] if arms else list(spec.arms)
    unknown = [name for name in names if name not in spec.arms]
    if unknown:
        raise ConfigError(f"--arms: no arm {unknown[0]!r} in the ablation file; its arms: {', '.join(spec.arms)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--arms {arms}: an arm is named twice")
    if not names:
        raise ConfigError("--arms: name at least one arm")
    return [spec.resolve(name) for name in names]
