"""``python -m agentevolver.config migrate OLD.yaml [-o NEW.yaml]``: rewrite a reference AgentEvolver config.

The reference's presets do not run here as they are (its defaults list repeats verl's ``ppo_trainer``, its
memory settings live under ``exp_manager.reme``, some keys moved into ``agent_flow``), and a key that is
merely ignored would silently change the run. The migration applies the table in
:mod:`agentevolver.config.reference_keys` to every key of the file, keeps what is spelled alike, lists every
key it moved, renamed or could not map (with what to do instead), writes the settings it could not carry
as comments at the end of the new file, and checks that the result composes and validates.

Exit status: 0 written and valid; 1 written, but the migrated config does not validate yet (the report
says why); 2 nothing written (unreadable input, refused output path).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentevolver.config.translate import (
    UNMAPPED,
    Change,
    leaves,
    show,
    translate_defaults,
    translate_key,
    translate_searchpath,
)
from agentevolver.errors import ConfigError

__all__ = ["Migration", "format_report", "load_yaml", "main", "migrate_tree", "render_yaml"]

_REFERENCE = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")

#: Printed for presets: their base config is not the reference's any more.
BASE_NOTE = (
    "the reference's presets build on the reference's config/agentevolver.yaml (appworld, Qwen2.5 on 8 GPUs "
    "with vLLM); this file now builds on config/agentevolver.yaml here, whose defaults differ (codebox, a small "
    "model on the CPU backend). Set what your run needs in the migrated file or after `--`, e.g. "
    "env_service.env_type, actor_rollout_ref.model.path, backend=gpu (docs/configuration.md)"
)


@dataclass
class Migration:
    """The migrated config (plain containers), every change made, and how many keys were kept as they are."""

    tree: dict[str, Any]
    changes: list[Change] = field(default_factory=list)
    kept: int = 0
    #: The old file built on the (reference's) root config: a preset such as examples/basic.yaml.
    is_preset: bool = False

    @property
    def unmapped(self) -> list[Change]:
        """Settings of the old file that do not reach the new one."""
        return [change for change in self.changes if change.kind in UNMAPPED]


def load_yaml(path: Path) -> dict[str, Any]:
    """A config file as plain containers, interpolations unresolved; :class:`ConfigError` naming the file."""
    try:
        node = OmegaConf.load(path)
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: no such file") from err
    except (OmegaConfBaseException, ValueError, OSError) as err:
        raise ConfigError(f"{path}: cannot read it as YAML: {err}") from err
    data = OmegaConf.to_container(node, resolve=False)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top, got a list")
    return data


def migrate_tree(old: Mapping[str, Any], known: Callable[[str], bool]) -> Migration:
    """Rewrite a reference config (plain containers). ``known(path)`` tells whether this project's root
    config has the key, so keys that are neither a reference key nor ours are reported (and kept)."""
    tree = copy.deepcopy(dict(old))
    result = Migration(tree, is_preset="agentevolver" in (tree.get("defaults") or []))
    defaults, changes = translate_defaults(list(tree.get("defaults") or []), complete=True)
    tree["defaults"] = defaults
    result.changes += changes
    _migrate_searchpath(tree, result)
    moved: list[Change] = []
    for path, value in leaves({k: v for k, v in old.items() if k not in ("defaults", "hydra")}):
        change = translate_key(path, value, old)
        if change is None:
            if known(path):
                result.kept += 1
            else:
                result.changes.append(Change(path, "unknown", value, {path: value},
                                             "kept, but it is not a key of this project's root config "
                                             "(a typo, or a key of a newer verl?)"))
            continue
        _remove(tree, path)
        result.changes.append(change)
        moved.append(change)
    for change in moved:
        clashes = [clash for new_path, value in change.new.items()
                   if (clash := _place(tree, new_path, value, anchor=change.old.split(".")[0])) is not None]
        if clashes:
            result.changes[result.changes.index(change)] = Change(
                change.old, "no_equivalent", change.value, {}, "; ".join(clashes))
    _rewrite_interpolations(tree, old, result)
    result.tree = {"defaults": tree.pop("defaults"), **tree}  # the defaults list first, where readers look
    return result


def _migrate_searchpath(tree: dict[str, Any], result: Migration) -> None:
    hydra = tree.get("hydra")
    if not isinstance(hydra, dict) or not isinstance(hydra.get("searchpath"), list):
        return
    kept, changes = translate_searchpath(hydra["searchpath"])
    result.changes += changes
    if kept:
        hydra["searchpath"] = kept
    else:
        del hydra["searchpath"]
    if not hydra:
        del tree["hydra"]


def _remove(tree: dict[str, Any], path: str) -> None:
    """Delete a leaf and the mappings that only held it."""
    parts = path.split(".")
    chain = [tree]
    for part in parts[:-1]:
        chain.append(chain[-1][part])
    del chain[-1][parts[-1]]
    for depth in range(len(parts) - 1, 0, -1):
        if chain[depth]:
            break
        del chain[depth - 1][parts[depth - 1]]


def _place(tree: dict[str, Any], path: str, value: Any, *, anchor: str) -> str | None:
    """Set ``path``; a new top-level section goes right after ``anchor`` (where the old key was). A key
    that the file also sets under its new name keeps that value: returns why the old one is lost."""
    parts = path.split(".")
    if parts[0] not in tree:
        items = list(tree.items())
        at = next((i + 1 for i, (key, _v) in enumerate(items) if key == anchor), len(items))
        tree.clear()
        tree.update(dict([*items[:at], (parts[0], {} if parts[1:] else value), *items[at:]]))
        if not parts[1:]:
            return None
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return f"{path} cannot be set: {part} is not a mapping in the file"
    if parts[-1] in node and node[parts[-1]] != value:
        return f"the file also sets {path}={show(node[parts[-1]])}, which is kept"
    node[parts[-1]] = value
    return None


def _rewrite_interpolations(tree: dict[str, Any], old: Mapping[str, Any], result: Migration) -> None:
    """``${old.key}`` -> ``${new.key}``; a reference to a key that is gone gets that key's value from the
    old file (or, when the file does not set it, the key holding it cannot be carried)."""
    for path, value in list(leaves({k: v for k, v in tree.items() if k != "defaults"})):
        if not isinstance(value, str) or not _REFERENCE.search(value):
            continue
        notes: list[str] = []
        new_value: Any = value
        for ref in dict.fromkeys(_REFERENCE.findall(value)):
            change = translate_key(ref, _lookup(old, ref), old)
            if change is None:
                continue
            if change.kind == "renamed":  # the same key, only some of its values are spelled differently
                continue
            if change.kind == "moved" and len(change.new) == 1:
                target = next(iter(change.new))
                new_value = new_value.replace("${" + ref + "}", "${" + target + "}")
                notes.append(f"{ref} is now {target}")
                continue
            literal = _lookup(old, ref)
            if literal is _ABSENT or (isinstance(literal, str) and _REFERENCE.search(literal)):
                _remove(tree, path)
                result.changes.append(Change(path, "no_equivalent", value, {},
                                             f"it refers to {ref}, which has no key here and no value in "
                                             "this file: set it yourself"))
                break
            new_value = literal if new_value == "${" + ref + "}" else \
                new_value.replace("${" + ref + "}", str(literal))
            notes.append(f"{ref} has no key here: its value {show(literal)} was written in")
        else:
            if notes:
                _set(tree, path, new_value)
                result.changes.append(Change(path, "rewrote", value, {path: new_value}, "; ".join(notes)))


_ABSENT = object()


def _lookup(tree: Mapping[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _ABSENT
        node = node[part]
    return node


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node[part]
    node[last] = value


# -- output -------------------------------------------------------------------------------------------------

def render_yaml(migration: Migration, source: Path) -> str:
    """The migrated config as YAML: a header, the keys, and the settings that could not be carried as
    comments (so nothing the old file said disappears without a trace)."""
    lines = [f"# Migrated from {source} by `python -m agentevolver.config migrate`.",
             "# Reference AgentEvolver -> this project: docs/configuration.md, \"Migrating a reference config\".",
             "", yaml.dump(migration.tree, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                           default_flow_style=False, width=110).rstrip()]
    lost = _trailer(migration)
    if lost:
        lines += ["", "# Not carried over (no key here):"]
        for change in lost:
            lines.append(f"#   {change.old}: {json.dumps(change.value, ensure_ascii=False)}")
            lines.append(f"#     {'dropped' if change.kind == 'dropped' else 'no equivalent'}: {change.note}")
    return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (experience templates) in double quotes with ``\\n``, as people write them."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"' if "\n" in value else None)


_Dumper.add_representer(str, _represent_str)


def _trailer(migration: Migration) -> list[Change]:
    """Key settings that do not reach the new file (the defaults list and search path are structure)."""
    return [change for change in migration.unmapped if change.old not in ("defaults", "hydra.searchpath")]


_LABELS = {"moved": "moved", "renamed": "renamed", "rewrote": "rewrote", "added": "added", "dropped": "dropped",
           "no_equivalent": "NO EQUIVALENT", "unknown": "unknown"}


def format_report(migration: Migration, source: Path, dest: str) -> str:
    """One line per change, grouped: what moved, what was rewritten, what could not be mapped and why."""
    lines = [f"migrate: {source} -> {dest}"]
    order = ("moved", "renamed", "rewrote", "added", "dropped", "no_equivalent", "unknown")
    for kind in order:
        for change in (c for c in migration.changes if c.kind == kind):
            if change.old in ("defaults", "hydra.searchpath"):
                text = f"{change.old}: {change.value} ({change.note})"
            elif kind == "rewrote":
                text = f"{change.old}: {show(change.value)} -> {show(change.new[change.old])} ({change.note})"
            elif kind == "unknown":
                text = f"{change.old}={show(change.value)}: {change.note}"
            else:
                text = change.describe(advice=False)
            lines.append(f"  {_LABELS[kind]:<14} {text}")
    count = {kind: sum(1 for c in migration.changes if c.kind == kind) for kind in order}
    lines.append(f"  {'kept':<14} {migration.kept} key(s) as they are")
    lines.append(f"  summary: {count['moved'] + count['renamed'] + count['rewrote']} moved or rewritten, "
                 f"{count['dropped']} dropped (nothing lost), {count['no_equivalent']} with no equivalent"
                 + (" (their values are listed at the end of the new file)" if _trailer(migration) else "")
                 + (f", {count['unknown']} unknown (kept)" if count["unknown"] else ""))
    if migration.is_preset:
        lines.append(f"note: {BASE_NOTE}")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------------------

def _known_keys() -> Callable[[str], bool]:
    """``path -> bool``: the key exists in this project's root config (or under a mapping that takes any key:
    an empty one such as env_service.create_params, or one that is null by default)."""
    from agentevolver.config.loader import compose_config

    root = OmegaConf.to_container(compose_config(), resolve=False)

    def known(path: str) -> bool:
        node: Any = root
        for part in path.split("."):
            if node is None or node == {}:
                return True
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    return known


def _check(text: str, dest: Path | None) -> str | None:
    """Compose and validate the migrated config as the trainer would; the problem, or None."""
    from agentevolver.config.loader import load_config

    try:
        if dest is not None:
            load_config(config_name=dest.stem, config_dir=dest.parent)
        else:
            with tempfile.TemporaryDirectory(prefix="agentevolver-migrate-") as folder:
                (Path(folder) / "migrated.yaml").write_text(text)
                load_config(config_name="migrated", config_dir=folder)
    except ConfigError as err:
        return str(err)
    return None


def main(argv: list[str]) -> int:
    """``migrate OLD.yaml [-o NEW.yaml] [--force] [--no-check]``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m agentevolver.config migrate",
        description="Rewrite a reference AgentEvolver config for this project and report every key that "
                    "moved, was renamed or could not be mapped (docs/configuration.md).")
    parser.add_argument("old", type=Path, help="the reference config, e.g. examples/basic.yaml")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="write the migrated config here (default: print it; the report goes to stderr)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output file")
    parser.add_argument("--no-check", dest="check", action="store_false",
                        help="do not compose and validate the migrated config")
    args = parser.parse_args(argv)
    try:
        dest = _output_path(args.old, args.output, args.force)
        migration = migrate_tree(load_yaml(args.old), _known_keys())
    except ConfigError as err:
        sys.stderr.write(f"config error: {err}\n")
        return 2
    text = render_yaml(migration, args.old)
    if dest is None:
        sys.stdout.write(text)
    else:
        dest.write_text(text)
    sys.stderr.write(format_report(migration, args.old, str(dest) if dest else "stdout") + "\n")
    if not args.check:
        return 0
    problem = _check(text, dest)
    if problem is None:
        sys.stderr.write("check: the migrated config composes and validates\n")
        return 0
    sys.stderr.write(f"check: the migrated config does not validate yet:\n  {problem}\n")
    return 1


def _output_path(old: Path, output: Path | None, force: bool) -> Path | None:
    if output is None:
        return None
    if output.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"-o {output}: expected a .yaml file name")
    if output.stem == "agentevolver":
        raise ConfigError(f"-o {output}: agentevolver.yaml is the root config's name, which the migrated file "
                          "lists in its defaults; choose another name")
    if output.exists() and output.resolve() == old.resolve():
        raise ConfigError(f"-o {output}: that is the input file; write the migration next to it")
    if output.exists() and not force:
        raise ConfigError(f"-o {output}: the file exists; pass --force to overwrite it")
    if not output.parent.is_dir():
        raise ConfigError(f"-o {output}: folder {output.parent} does not exist")
    return output

