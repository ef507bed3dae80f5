"""Stages ``save_checkpoint`` and ``update_weights``: verl's checkpoint when one is due, then the new weights to
the rollout servers, so the next step's episodes (and this step's validation) run on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentevolver.verl.step.update import trains_actor

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["checkpoint_due", "save_checkpoint", "sync_weights"]


def save_checkpoint(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``save_checkpoint``: verl's checkpoint of the step's weights, when the actor trained and one is due."""
    if trains_actor(state, trainer) and checkpoint_due(trainer, state.step):
        trainer._save_checkpoint()
    return state


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
