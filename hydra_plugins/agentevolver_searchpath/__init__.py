"""Hydra search-path plugin: makes ``agentevolver`` and verl's ``ppo_trainer`` configs findable from anywhere.

Hydra discovers plugins in the ``hydra_plugins`` namespace package. With this one installed, any config
(an example preset, a launcher run record in another folder, a user's own file) can say
``defaults: [agentevolver, _self_]`` and ``agentevolver.yaml`` can say ``defaults: [ppo_trainer, ...]``
without hard-coded relative paths.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

_PROJECT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
_EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


class AgentEvolverSearchPathPlugin(SearchPathPlugin):
    """Appends the project's ``config/`` and ``examples/`` folders and verl's trainer configs to every Hydra
    search path (so ``--config-name quickstart`` finds ``examples/quickstart.yaml``)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="agentevolver", path=f"file://{_PROJECT_CONFIG_DIR}")
        search_path.append(provider="agentevolver-examples", path=f"file://{_EXAMPLES_DIR}")
        search_path.append(provider="verl", path="pkg://verl.trainer.config")
