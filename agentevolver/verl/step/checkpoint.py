"""Stages ``save_checkpoint`` and ``update_weights``: verl's checkpoint when one is due, then the new weights to
the rollout servers, so the next step's episodes (and this step's validation) run on them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agentevolver.verl.step.update import trains_actor

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["checkpoint_due", "save_checkpoint", "sync_weights"]

logger = logging.getLogger(__name__)


def save_checkpoint(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``save_checkpoint``: verl's checkpoint of the step's weights, when the actor trained and one is due.

    In async training the data loader has already given the producer later steps' tasks; the checkpoint keeps
    the loader's position right after this step's (``state.loader_state``), so a resume plays those steps again
    (:mod:`agentevolver.verl.async_loop`, "Checkpoints").
    """
    if not (trains_actor(state, trainer) and checkpoint_due(trainer, state.step)):
        return state
    ahead = trainer.rollout_ahead
    if ahead is None:
        trainer._save_checkpoint()
        return state
    with ahead.loader_lock:
        trainer._save_checkpoint()
        if state.loader_state is not None:
            _rewind_saved_loader(trainer, state)
    dropped = ahead.buffered_steps(after=state.step)
    if dropped:
        logger.warning("checkpoint of step %d: the episodes of step(s) %s, rolled out ahead, are not in it; a resume "
                    "plays those tasks again", state.step, ", ".join(map(str, dropped)))
    return state


def _rewind_saved_loader(trainer: AgentEvolverTrainer, state: StepState) -> None:
    """Overwrite the data loader state verl just saved with its position right after this step's tasks."""
    import os

    import torch

    folder = os.path.join(str(trainer.config.trainer.default_local_dir), f"global_step_{state.step}")
    torch.save(state.loader_state, os.path.join(folder, "data.pt"))


def sync_weights(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``update_weights``: the actor's weights to the rollout servers."""
    trainer.checkpoint_manager.update_weights(state.step)
    return state


def checkpoint_due(trainer: AgentEvolverTrainer, step: int) -> bool:
    """verl's rule: every ``save_freq`` steps, at the last step, or when the ESI instance is expiring."""
    from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

    freq = int(trainer.config.trainer.save_freq)
    expiring = should_save_ckpt_esi(max_steps_duration=getattr(trainer, "max_steps_duration", 0.0),
                                    redundant_time=trainer.config.trainer.esi_redundant_time)
    return freq > 0 and (step >= trainer.total_training_steps or step % freq == 0 or expiring)
