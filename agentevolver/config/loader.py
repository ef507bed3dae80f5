"""Compose the Hydra config and validate this project's sections, with errors that name the key.

Entry points (``main_ppo``, the launcher, the config CLI, tests) all go through :func:`load_config` (or,
inside an ``@hydra.main`` app, :func:`validate_config`), so a bad value fails the same way everywhere:
one :class:`~agentevolver.errors.ConfigError` whose message lists every offending key, what it must be,
and what it got.

The config package imports no mechanism, so names that only a mechanism's registry knows (a context manager,
a tool-call parser) are checked by functions the entry points pass in as ``checks``
(:func:`agentevolver.module.agent_flow.plugins.plugin_name_errors`); their messages join the others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from agentevolver.config.reference_check import check_composed, check_inputs, find_config_file
from agentevolver.config.schema import PROJECT_SECTIONS, AgentEvolverSettings
from agentevolver.errors import ConfigError
from agentevolver.paths import CONFIG_DIR, REPO_ROOT

ROOT_CONFIG_NAME = "agentevolver"

#: A check over the resolved project sections (section name -> plain dict): one message per problem, each
#: naming its key ("agent_flow.context_template: must be one of ...").
SectionCheck = Callable[[Mapping[str, Any]], list[str]]


def compose_config(
    overrides: Sequence[str] = (),
    *,
    config_name: str = ROOT_CONFIG_NAME,
    config_dir: str | Path | None = None,
) -> DictConfig:
    """Compose ``config_name`` from ``config_dir`` (default: the project's ``config/``) with overrides.

    Hydra's own errors (unknown key, bad override syntax, missing config file) are re-raised as
    :class:`ConfigError` with Hydra's message, which already names the key, plus the usual fix.
    """
    directory = Path(config_dir).resolve() if config_dir is not None else CONFIG_DIR
    if not directory.is_dir():
        raise ConfigError(f"config directory {str(directory)!r} does not exist; pass an existing folder")
    # A reference AgentEvolver preset or key: one message naming each old key and its new name.
    check_inputs(find_config_file(config_name, [directory, CONFIG_DIR, REPO_ROOT / "examples"]), overrides)
    try:
        with initialize_config_dir(config_dir=str(directory), version_base=None):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        hint = ""
        if "not in struct" in str(err) or "Could not override" in str(err):
            hint = " (to add a key that is not in the config, prefix the override with '+')"
        elif "appears more than once in the final defaults list" in str(err):
            hint = (" (a defaults list names a config that config/agentevolver.yaml already includes, such as "
                    "verl's ppo_trainer: remove it; `python -m agentevolver.config migrate FILE` converts a "
                    "reference AgentEvolver preset)")
        raise ConfigError(f"cannot compose config {config_name!r}: {err}{hint}") from err


def validate_config(cfg: DictConfig, *, checks: Sequence[SectionCheck] = ()) -> AgentEvolverSettings:
    """Resolve and validate this project's sections of a composed config.

    Returns the typed settings object that modules read their keys from. Raises :class:`ConfigError`
    naming every bad key (all problems at once, not one per run), those found by ``checks`` included.
    """
    check_composed(cfg)
    missing = [name for name in PROJECT_SECTIONS if name not in cfg]
    if missing:
        raise ConfigError(
            f"config has no section(s) {', '.join(missing)}; start your config from the root config with "
            f"`defaults: [{ROOT_CONFIG_NAME}, _self_]`"
        )
    sections: dict[str, Any] = {}
    for name in PROJECT_SECTIONS:
        try:
            sections[name] = OmegaConf.to_container(cfg[name], resolve=True)
        except OmegaConfBaseException as err:
            key = getattr(err, "full_key", None) or name
            raise ConfigError(f"{key}: cannot resolve interpolation: {err.msg}") from err
    found = [message for check in checks for message in check(sections)]
    try:
        settings = AgentEvolverSettings.model_validate(sections)
    except ValidationError as err:
        raise ConfigError(problems([*_problem_lines(err), *found])) from err
    if found:
        raise ConfigError(problems(found))
    return settings


def load_config(
    overrides: Sequence[str] = (),
    *,
    config_name: str = ROOT_CONFIG_NAME,
    config_dir: str | Path | None = None,
    checks: Sequence[SectionCheck] = (),
) -> tuple[DictConfig, AgentEvolverSettings]:
    """Compose and validate in one call: the full config (for verl) and our typed settings."""
    cfg = compose_config(overrides, config_name=config_name, config_dir=config_dir)
    return cfg, validate_config(cfg, checks=checks)


def format_validation_error(err: ValidationError) -> str:
    """Turn pydantic's error list into one line per key: ``a.b.c: must be ...; got X``."""
    return problems(_problem_lines(err))


def problems(lines: Sequence[str]) -> str:
    """The message listing config problems, one ``key: what`` line each, under a count."""
    count = len(lines)
    return "\n".join([f"invalid config ({count} problem{'s' if count > 1 else ''}):", *(f"  {line}" for line in lines)])


def _problem_lines(err: ValidationError) -> list[str]:
    return [f"{'.'.join(str(part) for part in item['loc']) or '<root>'}: {_describe(item)}"
            for item in err.errors(include_url=False)]


def _describe(item: Any) -> str:
    """One error's explanation in 'must be' form, with the offending value."""
    kind = item["type"]
    got = item.get("input")
    ctx = item.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling against config/agentevolver.yaml"
    if kind == "missing":
        return "is required but missing"
    if kind == "literal_error":
        expected = ctx.get("expected", "").replace("'", "").replace(" or ", ", ")
        return f"must be one of {expected}; got {got!r}"
    if kind == "value_error":
        return str(ctx.get("error", item["msg"]))
    message = item["msg"]
    if message.startswith("Input should be"):
        message = "must be" + message[len("Input should be") :]
    elif message.startswith("String should"):
        message = "must" + message[len("String should") :]
    return f"{message}; got {got!r}"
