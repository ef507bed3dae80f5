"""Hydra search-path plugin: makes ``agentevolver`` and verl's ``ppo_trainer`` configs findable from anywhere.

Hydra discovers plugins in the ``hydra_plugins`` namespace package. With this one installed, any config
(an example preset, a launcher run record in another folder, a user's own file) can say
``defaults: [agentevolver, _self_]`` and ``agentevolver.yaml`` can say ``defaults: [ppo_trainer, ...]``
without hard-coded relative paths.
"""

from __future__ import annotations

import importlib.util
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
        search_path.append(provider="verl", path=_verl_trainer_config_source())


def _verl_trainer_config_source() -> str:
    """verl's trainer configs as a folder when verl is installed as files (the usual case), else as a package.

    Why not always ``pkg://verl.trainer.config``: Hydra imports a ``pkg://`` package to read it, and importing
    ``verl`` imports torch and tensordict (~5 s on a 2-core CPU) in every process that only composes a config
    (the launcher, the config CLI). ``find_spec`` of the top-level package locates it without running it.
    """
    spec = importlib.util.find_spec("verl")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        folder = Path(location) / "trainer" / "config"
        if (folder / "ppo_trainer.yaml").is_file():
            return f"file://{folder}"
    return "pkg://verl.trainer.config"
