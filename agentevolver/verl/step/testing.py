"""Stage ``testing``: validation every ``trainer.test_freq`` steps and at the last step, on the weights the
rollout servers now hold (:meth:`~agentevolver.verl.step.trainer.AgentEvolverTrainer.validations`: verl's
validation, and a second pass with another experience mode where ``exp_manager.val_compare_mode`` asks).

Per-task records come from verl's own per-sample dump, not from this stage: with ``trainer.validation_data_dir``
set (every ablation run: :mod:`agentevolver.experiments.records`), each validation writes ``<dir>/<step>.jsonl``
with every sample's ``task_id``, ``acc`` and ``score``, including the validations this stage does not run (before
training, ``trainer.val_only``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["validate"]


def validate(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``testing``: ``val-core/*`` and ``val-aux/*`` when validation is due this step."""
    freq = trainer.config.trainer.test_freq
    last = state.step >= trainer.total_training_steps
    if freq > 0 and (last or state.step % freq == 0):
        state.metrics.update(trainer.validations(final=last))
    return state
