"""Translate one reference config key (or the defaults list, or ``hydra.searchpath``) into this project's terms.

Shared by the migration (which rewrites a whole file) and the start-up refusal (which names what to change),
so the two can never disagree about a key. Pure functions over plain containers: no Hydra, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agentevolver.config.reference_keys import (
    DEFAULTS_DROPPED,
    NOTHING,
    REFERENCE_SEARCHPATH,
    KeyRule,
    rule_for,
    same_value,
)

__all__ = ["Change", "ChangeKind", "leaves", "show", "translate_defaults", "translate_key",
           "translate_searchpath"]

#: moved = new key (maybe a new value too); renamed = same key, new spelling of the value; dropped = no key
#: here and none needed; no_equivalent = no key here and the setting is lost (the note says what to do);
#: unknown = neither a reference key nor one of ours (kept); added = defaults entry this project needs;
#: rewrote = an interpolation now points at the new key or holds the value of a key that is gone.
ChangeKind = Literal["moved", "renamed", "dropped", "no_equivalent", "unknown", "added", "rewrote"]

#: Kinds whose setting does not reach the new config (reported as "could not map").
UNMAPPED: tuple[ChangeKind, ...] = ("dropped", "no_equivalent")


@dataclass(frozen=True)
class Change:
    """What happens to one old key: its path, old value, the new ``{key: value}`` it becomes, and why."""

    old: str
    kind: ChangeKind
    value: Any
    new: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    exact: bool = True

    def describe(self, *, advice: bool = True) -> str:
        """``old -> new`` in one line, as the refusal (``advice``: say what to do) and the migration report
        print it."""
        if self.kind in ("moved", "renamed"):
            (first_key, first_value), *more = self.new.items()
            if not more and same_value(first_value, self.value):
                text = f"{self.old}: now {first_key}"
            else:
                text = f"{self.old}={show(self.value)}: now " + ", ".join(
                    f"{key}={show(value)}" for key, value in self.new.items())
            if self.note:
                text += f" ({'' if self.exact else 'closest: '}{self.note})"
            return text
        if self.kind == "dropped" and advice:
            return f"{self.old}={show(self.value)}: remove it ({self.note})"
        if self.kind == "no_equivalent" and advice:
            return f"{self.old}={show(self.value)}: no equivalent here; {self.note}"
        if self.kind in UNMAPPED:
            return f"{self.old}={show(self.value)}: {self.note}"
        return f"{self.old}: {self.note}"


def show(value: Any, limit: int | None = 80) -> str:
    """A value as YAML (and a Hydra override) would spell it: true, null, "text"; cut to ``limit`` chars."""
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) or not value.isidentifier() \
        else value
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted paths and values of a nested mapping's leaves (lists and empty mappings are leaves)."""
    if isinstance(node, Mapping) and node:
        for key, child in node.items():
            yield from leaves(child, f"{prefix}.{key}" if prefix else str(key))
    elif prefix:
        yield prefix, node


def _mapped(rule: KeyRule, value: Any) -> tuple[bool, Any]:
    for old, new in rule.values.items():
        if same_value(value, old) and not isinstance(value, list | dict):
            return True, new
    return False, None


def translate_key(path: str, value: Any, tree: Mapping[str, Any]) -> Change | None:
    """The change for the old key ``path`` holding ``value`` (``tree``: the whole old config, for rules
    that look at a neighbour); None when the key and value mean the same here."""
    found = rule_for(path)
    if found is None:
        return None
    rule, below = found
    hit, target = _mapped(rule, value) if not below else (False, None)
    if hit:
        if target is NOTHING:
            return Change(path, "dropped", value, {}, rule.note)
        new = dict(target) if isinstance(target, Mapping) else {rule.new or path: target}
        if list(new) == [path] and same_value(new[path], value):
            return None
        kind: ChangeKind = "renamed" if path in new else "moved"
        return Change(path, kind, value, new, rule.note, rule.exact)
    if rule.new is not None:
        new_path = f"{rule.new}.{below}" if below else rule.new
        if new_path == path:  # a rule about values only, and this value is spelled alike
            return None
        return Change(path, "moved", value, {new_path: value}, rule.note, rule.exact)
    kind = "dropped" if rule.dropped_when(value, tree) else "no_equivalent"
    return Change(path, kind, value, {}, rule.note)


def translate_defaults(entries: list[Any], *, complete: bool) -> tuple[list[Any], list[Change]]:
    """The defaults list without the reference's entries. ``complete``: also add what this project's
    presets need (``agentevolver`` first, ``_self_`` last) when missing, as the migration does."""
    kept: list[Any] = []
    changes: list[Change] = []
    for entry in entries:
        if isinstance(entry, str) and entry in DEFAULTS_DROPPED:
            changes.append(Change("defaults", "dropped", entry, {}, DEFAULTS_DROPPED[entry]))
        else:
            kept.append(entry)
    if complete and "agentevolver" not in kept:
        kept.insert(0, "agentevolver")
        changes.append(Change("defaults", "added", "agentevolver", {"defaults": "agentevolver"},
                              "added `agentevolver`: every config here starts from the root config"))
    if complete and "_self_" not in kept:
        kept.append("_self_")
        changes.append(Change("defaults", "added", "_self_", {"defaults": "_self_"},
                              "added `_self_` last: the file's own keys override the root config's"))
    return kept, changes


def translate_searchpath(entries: list[Any]) -> tuple[list[Any], list[Change]]:
    """``hydra.searchpath`` without the reference's folders (this project's plugin adds its own)."""
    kept = [entry for entry in entries if entry not in REFERENCE_SEARCHPATH]
    changes = [Change("hydra.searchpath", "dropped", entry, {},
                      "this project's Hydra search-path plugin adds config/ and verl's trainer configs")
               for entry in entries if entry in REFERENCE_SEARCHPATH]
    return kept, changes
