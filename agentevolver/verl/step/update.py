"""Stages ``update_critic`` and ``update_actor``: verl's updates over every row of the step. The actor's loss is
the one :meth:`~agentevolver.verl.step.trainer.AgentEvolverTrainer.init_workers` gave it through verl's
``set_loss_fn`` (it shows a registered policy loss the rows' ``exp_mask``: :mod:`.exp_loss`). The actor trains
from step ``trainer.critic_warmup + 1`` on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["trains_actor", "update_actor", "update_critic"]


def update_critic(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``update_critic``: the critic's update, when the run has one (``critic/*`` metrics)."""
    if trainer.use_critic:
        state.metrics.update(_reduced(trainer._update_critic(state.batch)))
    return state


def update_actor(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``update_actor``: the actor's update once the critic's warm-up is over (``actor/*`` metrics)."""
    if trains_actor(state, trainer):
        state.metrics.update(_reduced(trainer._update_actor(state.batch)))
    return state


def trains_actor(state: StepState, trainer: AgentEvolverTrainer) -> bool:
    """Whether this step updates the actor (verl's rule: after ``trainer.critic_warmup`` steps)."""
    return trainer.config.trainer.critic_warmup <= state.step


def _reduced(output: Any) -> dict[str, float]:
    from verl.utils.metric import reduce_metrics

    return reduce_metrics(output.meta_info["metrics"])
