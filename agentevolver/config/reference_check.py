"""Refuse a reference AgentEvolver config, key or override at start-up, naming each old key and its new name.

Without this, a reference preset fails inside Hydra with "model_engine appears more than once in the final
defaults list", ``exp_manager.reme`` is rejected with "remove it" (losing the memory settings, which live
under ``memory`` here), and a renamed key in one of verl's sections (``actor_rollout_ref.rollout.
multi_turn.max_steps``) or given as ``+old.key=value`` is accepted and silently ignored. Every entry point
checks its inputs here first: the config file and its overrides before Hydra composes them (the launcher
and ``python -m agentevolver.config`` through :func:`~agentevolver.config.loader.compose_config`,
``main_ppo`` from its command line), and the composed config once more in ``validate_config``. The
answer is always one :class:`ConfigError` listing every old key with its new name, and the command that
converts the file. Config keys are never renamed on the fly: a run's recorded config keeps one spelling.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentevolver.config.reference_keys import KEY_RULES, same_value
from agentevolver.config.translate import Change, leaves, show, translate_defaults, translate_key
from agentevolver.errors import ConfigError
from agentevolver.paths import CONFIG_DIR, REPO_ROOT

__all__ = ["check_composed", "check_hydra_argv", "check_inputs", "file_problems", "find_config_file",
           "override_problems"]

MIGRATION_DOC = 'docs/configuration.md, "Migrating a reference config"'

#: Hydra's command-line options that take a value (``main_ppo --config-name quickstart ...``).
_HYDRA_VALUE_OPTIONS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name",
                        "--config-dir": "dir", "-cd": "dir", "--cfg": None, "-c": None, "--package": None,
                        "-p": None, "--experimental-rerun": None}


def _load(path: Path) -> dict[str, Any] | None:
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OmegaConfBaseException, yaml.YAMLError, ValueError, OSError):
        return None  # an unreadable file is Hydra's to report, with its own message
    return data if isinstance(data, dict) else None


def _key_changes(tree: dict[str, Any]) -> list[Change]:
    body = {key: value for key, value in tree.items() if key not in ("defaults", "hydra")}
    changes = (translate_key(path, value, tree) for path, value in leaves(body))
    return [change for change in changes if change is not None]


def file_problems(path: Path, _seen: set[Path] | None = None) -> list[str]:
    """Reference keys in a config file and in the files of its own folder that its defaults list names."""
    seen = _seen if _seen is not None else set()
    if path.resolve() in seen:
        return []
    seen.add(path.resolve())
    tree = _load(path)
    if tree is None:
        return []
    defaults = tree.get("defaults") if isinstance(tree.get("defaults"), list) else []
    problems: list[str] = []
    if "agentevolver" in defaults:
        _kept, dropped = translate_defaults(defaults, complete=False)
        problems += [f"defaults: {change.value}: remove it ({change.note})" for change in dropped]
    problems += [change.describe() for change in _key_changes(tree)]
    labelled = [f"{path}: {line}" for line in problems] if _seen is not None else problems
    for entry in defaults:
        sibling = path.parent / f"{entry}.yaml" if isinstance(entry, str) and entry not in (
            "_self_", "agentevolver") else None
        if sibling is not None and sibling.is_file():
            labelled += file_problems(sibling, seen)
    return labelled


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def override_problems(overrides: Sequence[str]) -> list[str]:
    """Hydra overrides (``+old.key=value``, ``old.key=value``, ``~old.key``) that name a reference key."""
    problems: list[str] = []
    for item in overrides:
        prefix = item[: len(item) - len(item.lstrip("+~"))]
        key, has_value, text = item[len(prefix):].partition("=")
        value = _parse_value(text) if has_value else None
        expand = isinstance(value, dict) and bool(value)
        pairs = list(leaves(value, key)) if expand else [(key, value)]
        changes = [change for path, leaf in pairs if (change := translate_key(path, leaf, {})) is not None]
        problems += [f"{item}: {_override_fix(change, prefix, None if expand else text)}" for change in changes]
        below = [rule.old for rule in KEY_RULES if rule.old.startswith(key + ".")]
        if not changes and below:
            problems.append(f"{item}: {key} is not a section here; its reference keys are {', '.join(below)} "
                            f"({MIGRATION_DOC})")
    return problems


def _override_fix(change: Change, prefix: str, text: str | None) -> str:
    """What to write instead of an override of a reference key (``text``: the value as typed)."""
    if change.kind not in ("moved", "renamed"):
        return change.describe().split(": ", 1)[1]
    if "~" in prefix:
        return f"{change.old} is not a key here (now {', '.join(change.new)})"
    keep = "++" if prefix == "++" else ""
    (key, value), *more = change.new.items()
    if not more and text is not None and same_value(value, change.value):
        return f"{change.old} is now {key}: write `{keep}{key}={text}`"
    written = " ".join(f"{keep}{new_key}={show(new_value, None)}" for new_key, new_value in change.new.items())
    return f"{change.old}={show(change.value)} is now `{written}`"


def find_config_file(name: str, dirs: Sequence[Path | None]) -> Path | None:
    """The file Hydra will load for ``name``: the first ``<dir>/<name>.yaml`` that exists."""
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    for folder in dirs:
        if folder is not None and (folder / f"{stem}.yaml").is_file():
            return folder / f"{stem}.yaml"
    return None


def check_inputs(config_file: Path | None, overrides: Sequence[str]) -> None:
    """Raise one :class:`ConfigError` naming every reference key in the file and the overrides."""
    in_file = file_problems(config_file) if config_file is not None else []
    in_overrides = override_problems(overrides)
    if not in_file and not in_overrides:
        return
    count = len(in_file) + len(in_overrides)
    lines = [f"reference AgentEvolver config keys ({count} to change):"]
    if in_file:
        lines += [f"  in {config_file}:", *(f"    {line}" for line in in_file)]
    if in_overrides:
        lines += ["  in the overrides:", *(f"    {line}" for line in in_overrides)]
    if in_file and config_file is not None:
        target = config_file.with_name(f"{config_file.stem}_migrated.yaml")
        lines.append(f"Convert the file with `python -m agentevolver.config migrate {config_file} -o {target}`; "
                     f"{MIGRATION_DOC} lists every key.")
    else:
        lines.append(f"{MIGRATION_DOC} lists every key.")
    raise ConfigError("\n".join(lines))


def check_composed(cfg: DictConfig) -> None:
    """The composed config holds no reference key (one that came in through a nested preset, say)."""
    present = [rule for rule in KEY_RULES
               if OmegaConf.select(cfg, rule.old, default=None, throw_on_resolution_failure=False) is not None]
    if not present:
        return
    tree = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(tree, dict)
    changes: list[Change] = []
    for rule in present:
        node = _lookup(tree, rule.old)
        pairs = leaves(node, rule.old) if isinstance(node, dict) and node else [(rule.old, node)]
        changes += [change for path, value in pairs if (change := translate_key(path, value, tree)) is not None]
    if changes:
        raise ConfigError("\n".join([f"reference AgentEvolver config keys ({len(changes)} to change):",
                                     *(f"  {change.describe()}" for change in changes),
                                     f"{MIGRATION_DOC} lists every key."]))


def _lookup(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_hydra_argv(argv: Sequence[str]) -> None:
    """``main_ppo``'s command line: find the config file Hydra is about to load and check it and the
    overrides before Hydra composes them (a reference preset fails inside Hydra otherwise)."""
    found: dict[str, str] = {}
    overrides: list[str] = []
    args = iter(argv)
    for arg in args:
        option, eq, inline = arg.partition("=")
        if option in _HYDRA_VALUE_OPTIONS:
            value = inline if eq else next(args, "")
            if _HYDRA_VALUE_OPTIONS[option]:
                found[_HYDRA_VALUE_OPTIONS[option]] = value
        elif not arg.startswith("-"):
            overrides.append(arg)
    name = found.get("name", "agentevolver")
    dirs: list[Path | None] = []
    if "path" in found:
        dirs += [Path(found["path"]).expanduser(), Path(__file__).resolve().parents[1] / found["path"]]
    dirs += [Path(found["dir"]).expanduser() if "dir" in found else None, CONFIG_DIR, REPO_ROOT / "examples"]
    check_inputs(find_config_file(name, dirs), overrides)
