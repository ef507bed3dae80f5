"""The run record: ``<launcher.record_dir>/<experiment>/`` holds what is needed to see and repeat a launch.

- ``config.yaml``: the composed config (preset + overrides) with ``${trainer.experiment_name}`` replaced by
  the name everywhere, as the reference launcher does, so the run's folders, memory workspace and logs
  keep this name even if the file is later reused with another ``trainer.experiment_name``. Other
  interpolations stay, so the trainer resolves them exactly as a direct ``main_ppo`` run would. This is
  the file the training run is started from.
- ``config.resolved.yaml``: the same with every interpolation resolved, for reading and diffing.
- ``launch.json``: the command line, project version and git revision, services (started or reused, pid,
  log) and, once finished, the training exit code.
- ``logs/<service>.log``: each started service's output; ``hydra/``: the training run's Hydra output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import agentevolver
from agentevolver.paths import REPO_ROOT

__all__ = ["EXPERIMENT_PLACEHOLDER", "RunRecord", "fill_experiment_name", "project_revision"]

EXPERIMENT_PLACEHOLDER = "${trainer.experiment_name}"

CONFIG_NAME = "config"


def fill_experiment_name(node: Any, name: str) -> Any:
    """Replace :data:`EXPERIMENT_PLACEHOLDER` by ``name`` in every string of a (nested) container."""
    if isinstance(node, dict):
        return {key: fill_experiment_name(value, name) for key, value in node.items()}
    if isinstance(node, list):
        return [fill_experiment_name(value, name) for value in node]
    if isinstance(node, str):
        return node.replace(EXPERIMENT_PLACEHOLDER, name)
    return node


def project_revision() -> dict[str, Any]:
    """Package version, and the git commit of the source tree (``dirty`` when tracked files changed)."""
    info: dict[str, Any] = {"version": agentevolver.__version__, "git_revision": None, "git_dirty": None}
    try:
        revision = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True,
                                  text=True, check=True).stdout.strip()
        changes = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return info  # not a git checkout (an installed package): the version is all there is
    info.update(git_revision=revision, git_dirty=bool(changes))
    return info


class RunRecord:
    """Writes the record folder of one launch (overwriting the previous launch of the same experiment)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self.logs = self.folder / "logs"
        self.data: dict[str, Any] = {}

    @property
    def config_path(self) -> Path:
        return self.folder / f"{CONFIG_NAME}.yaml"

    @property
    def hydra_dir(self) -> Path:
        """Hydra's run folder of the training run (its ``.hydra/`` copy of the config, ``main_ppo.log``)."""
        return self.folder / "hydra"

    def log_path(self, file_name: str) -> Path:
        return self.logs / file_name

    def create(self, cfg: DictConfig, experiment: str, data: dict[str, Any]) -> None:
        """Write the config files and the first ``launch.json``; the previous launch's logs go."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (self.logs, self.hydra_dir):
            shutil.rmtree(stale, ignore_errors=True)
        self.logs.mkdir()
        container = OmegaConf.to_container(cfg, resolve=False)
        filled = OmegaConf.create(fill_experiment_name(container, experiment))
        self.config_path.write_text(OmegaConf.to_yaml(filled))
        resolved = self.folder / f"{CONFIG_NAME}.resolved.yaml"
        try:
            resolved.write_text(OmegaConf.to_yaml(filled, resolve=True))
        except OmegaConfBaseException as err:  # e.g. ${oc.env:X} of a variable only the trainer's machine has
            resolved.write_text(f"# could not resolve every interpolation here: {err}\n")
        self.data = {"experiment": experiment, "started_at": _now(), **project_revision(), **data}
        self.save()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def finish(self, exit_code: int) -> None:
        self.update(exit_code=exit_code, finished_at=_now())

    def save(self) -> None:
        tmp = self.folder / "launch.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        os.replace(tmp, self.folder / "launch.json")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
