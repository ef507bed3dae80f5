"""Stage ``judge`` (Self-Attributing): step labels for the episodes, from the judge LLM or the environment
(:meth:`~agentevolver.module.adv_processor.AdcaStage.label`), only with ``algorithm.adv_estimator=adca_grpo``
and within ``adca_grpo.prm_steps``. The advantage stage fuses them into the episodes' advantages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["label_steps"]


def label_steps(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``judge``: ``state.labels`` for the episode rows (None where ADCA does not label this step)."""
    state.labels = trainer.adca.label(state.episodes, state.step)
    return state
