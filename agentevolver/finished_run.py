"""Is this run already trained to its last step? Asked before anything starts, so a second run says so.

verl resumes from the newest checkpoint in ``trainer.default_local_dir`` (``resume_mode: auto``) and then
starts its loop at the next step, even when that step is past ``total_training_steps``: a finished quickstart
started again trained a "5/4" step with no gradient, validated again and appended it to ``metrics.jsonl``.
The launcher and ``main_ppo`` ask :func:`finished_message` first and stop in seconds with the way out; the
trainer keeps a guard of its own for runs whose step count is only known from the dataset.

The checkpoint is found as verl's ``find_latest_ckpt_path`` finds it (the step in
``latest_checkpointed_iteration.txt``, whose ``global_step_<N>`` folder must exist), read here without
importing verl, so the launcher can ask before it starts any service.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

__all__ = ["already_trained_message", "checkpoint_step", "finished_message", "latest_checkpoint_step"]

#: The file verl writes next to its ``global_step_<N>`` folders.
LATEST_FILE = "latest_checkpointed_iteration.txt"


def checkpoint_step(trainer: Any) -> int | None:
    """The step a resume of ``trainer`` (the ``trainer`` config section) would start from; None = fresh."""
    mode = str(trainer.get("resume_mode", "auto"))
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = str(trainer.get("resume_from_path") or "")
        if "global_step_" not in path:
            return None  # verl refuses it with its own message
        try:
            return int(path.rstrip("/").split("global_step_")[-1])
        except ValueError:
            return None
    return latest_checkpoint_step(Path(str(trainer.default_local_dir)))


def latest_checkpoint_step(folder: Path) -> int | None:
    """The step of the newest checkpoint in the run folder ``folder`` (what ``resume_mode: auto`` resumes
    from), or None when it holds none."""
    folder = folder.expanduser()
    if not folder.is_absolute():
        folder = Path(os.getcwd()) / folder
    try:
        step = int((folder / LATEST_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return step if (folder / f"global_step_{step}").is_dir() else None


def already_trained_message(step: int, total: int, folder: str, experiment: str) -> str:
    """What a finished run, started again, says (the launcher, ``main_ppo`` and the trainer share it)."""
    return (f"this run is already trained to step {step} of trainer.total_training_steps={total} (checkpoint in "
            f"{folder}); nothing to do. To train again from the start, add trainer.resume_mode=disable (the "
            f"checkpoints there are then overwritten) or choose another trainer.experiment_name (now "
            f"{experiment!r}); to train further, raise trainer.total_training_steps")


def finished_message(cfg: DictConfig) -> str | None:
    """The :func:`already_trained_message` when ``cfg``'s run has nothing left to train, else None.

    None also when ``trainer.total_training_steps`` is unset (the count then comes from the dataset and
    epochs; the trainer checks it once it knows).
    """
    trainer = cfg.trainer
    total = trainer.get("total_training_steps")
    if total is None:
        return None
    step = checkpoint_step(trainer)
    if step is None or step < int(total):
        return None
    return already_trained_message(step, int(total), str(trainer.default_local_dir), str(trainer.experiment_name))
