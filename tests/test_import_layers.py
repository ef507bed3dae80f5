"""The package's layers, read from its import statements: no module imports a layer above its own.

Why a test: an upward import is how a refactor quietly turns the config package or the mechanisms into
something that needs the trainer (or a server) to load. Every ``import`` and ``from ... import`` in the source
counts, also those inside functions (a lazy import is still a dependency). Entry points (``__main__.py``) sit
above everything and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "agentevolver"

#: package (folder under agentevolver/) -> the top-level names its modules must never import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # The config package is data: mechanisms check their own plug-in names (module/agent_flow/plugins.py).
    "config": ("agentevolver.module", "agentevolver.verl", "agentevolver.gateway", "agentevolver.memory_service",
               "agentevolver.llm_server", "agentevolver.backends", "verl"),
    # Wire models are shared by clients and servers, so they import neither.
    "schema": ("agentevolver.module", "agentevolver.verl", "agentevolver.client", "agentevolver.memory_service",
               "agentevolver.llm_server", "agentevolver.gateway", "env_service", "verl"),
    # Clients talk to services over HTTP and import the wire models, never a server package.
    "client": ("agentevolver.memory_service", "agentevolver.llm_server", "agentevolver.gateway", "env_service",
               "agentevolver.verl", "verl"),
    # Generation backends are torch/transformers only; their verl adapters are agentevolver/verl/cpu/.
    "backends": ("verl", "agentevolver.verl", "agentevolver.module", "agentevolver.client", "agentevolver.gateway",
                 "agentevolver.memory_service", "agentevolver.llm_server", "env_service"),
    # The mechanisms run without verl (ARCHITECTURE.md: "module/ the mechanisms, no verl import").
    "module": ("verl", "agentevolver.verl", "agentevolver.gateway", "agentevolver.memory_service",
               "agentevolver.llm_server"),
}


def imported_names(path: Path, root: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def violations(layer: str, root: Path = PACKAGE) -> list[str]:
    """``file:line imports name`` for each import of ``layer``'s modules that its row of FORBIDDEN names."""
    bad = []
    for path in sorted((root / layer).rglob("*.py")):
        if path.name == "__main__.py":
            continue
        for line, name in imported_names(path, root):
            if any(name == banned or name.startswith(banned + ".") for banned in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_a_layer_above_it(layer: str) -> None:
    assert violations(layer) == []


def test_the_check_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself, on a package shaped like ours: the import this test was written against (config's
    schema importing the agent flow's models), a lazy one and a relative one are each found; __main__ is not."""
    config = tmp_path / "agentevolver" / "config"
    config.mkdir(parents=True)
    (config / "schema.py").write_text("from agentevolver.module.agent_flow.config import AgentFlowConfig\n")
    (config / "lazy.py").write_text("def f():\n    import verl.protocol\n")
    (config / "rel.py").write_text("from ..module import tools\nfrom . import schema\n")
    (config / "__main__.py").write_text("import agentevolver.module\n")
    assert violations("config", tmp_path / "agentevolver") == [
        "agentevolver/config/lazy.py:2 imports verl.protocol",
        "agentevolver/config/rel.py:1 imports agentevolver.module",
        "agentevolver/config/schema.py:1 imports agentevolver.module.agent_flow.config",
    ]
