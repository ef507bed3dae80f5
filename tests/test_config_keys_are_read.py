"""No dead config keys: every key of this project's sections is read by some code.

A key counts as read when its name appears in the project's code (outside the modules that only declare
the schema) as an attribute access (``settings.task_manager.n``) or a string (``cfg["n"]``,
``client_for_role(llm, "judge")``). Sections whose consumers land in a later issue are listed in
``PENDING``; the issue that builds the consumer deletes its entry, and from then on this test holds every
key of that section to account.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from omegaconf import DictConfig, OmegaConf

from agentevolver.config import PROJECT_SECTIONS, compose_config
from agentevolver.paths import REPO_ROOT

#: key-path prefix -> the issue whose module reads those keys (delete the entry when it lands).
PENDING: dict[str, str] = {}

#: Modules that declare the schema; a name appearing there does not mean anything reads it.
DECLARATIONS = {
    REPO_ROOT / "agentevolver" / "config" / "schema.py",
    REPO_ROOT / "agentevolver" / "config" / "agent_program.py",
    REPO_ROOT / "agentevolver" / "config" / "game.py",
    REPO_ROOT / "agentevolver" / "client" / "llm_config.py",
    REPO_ROOT / "agentevolver" / "module" / "agent_flow" / "config.py",
    REPO_ROOT / "agentevolver" / "module" / "context_manager" / "config.py",
}

CODE_ROOTS = [REPO_ROOT / "agentevolver", REPO_ROOT / "env_service", REPO_ROOT / "launcher.py"]


def _leaf_paths(node: DictConfig, prefix: str) -> Iterator[str]:
    for key in node:
        path = f"{prefix}.{key}"
        child = node[key] if not OmegaConf.is_missing(node, key) else None
        if isinstance(child, DictConfig):
            yield from _leaf_paths(child, path)
        else:
            yield path


def _config_keys() -> list[str]:
    cfg = compose_config()
    keys: list[str] = []
    for section in PROJECT_SECTIONS:
        keys.extend(_leaf_paths(cfg[section], section))
    # Endpoint names are user-chosen labels, not keys: check the endpoint fields once, under a fixed name.
    return sorted(
        {
            ".".join(["llm", "endpoints", "*", *parts[3:]]) if parts[:2] == ["llm", "endpoints"] else key
            for key in keys
            for parts in [key.split(".")]
        }
    )


def _names_used_in_code() -> set[str]:
    names: set[str] = set()
    files = [p for root in CODE_ROOTS for p in ([root] if root.is_file() else root.rglob("*.py"))]
    for path in files:
        if path in DECLARATIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


def _pending_reason(key: str) -> str | None:
    for prefix, reason in PENDING.items():
        if key == prefix or key.startswith(prefix + "."):
            return reason
    return None


def test_every_config_key_is_read_by_code() -> None:
    used = _names_used_in_code()
    dead = [key for key in _config_keys() if key.rsplit(".", 1)[-1] not in used and not _pending_reason(key)]
    assert not dead, "config keys that no code reads (use them, or delete them from the config):\n" + "\n".join(dead)


def test_pending_entries_still_match_config_keys() -> None:
    keys = _config_keys()
    stale = [prefix for prefix in PENDING if not any(k == prefix or k.startswith(prefix + ".") for k in keys)]
    assert not stale, f"PENDING lists prefixes that are no longer in the config: {stale}"
