"""Stages ``old_log_prob``, ``ref`` and ``values``: verl's passes over every row of the step (episode rows and
earlier samples alike), each once, with each GRPO group's prompt computed once when shared prompts are on
(the ``sample_rows`` stage asks for it).

In rollout-correction bypass mode (``algorithm.rollout_correction.bypass_mode``) the rollout's log-probs are
the old ones and the actor's pass does not run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["critic_values", "old_log_probs", "reference_log_probs"]


def old_log_probs(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``old_log_prob``: the old log-probs of every row: the rollout's in bypass mode, else the actor's pass
    (with ``actor/entropy`` and the rollout-vs-actor log-prob metrics)."""
    from verl.trainer.ppo.core_algos import agg_loss

    actor = trainer.config.actor_rollout_ref.actor
    batch = state.batch
    if trainer.bypass:
        from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

        apply_bypass_mode(batch=batch, rollout_corr_config=trainer.config.algorithm.rollout_correction,
                          policy_loss_config=actor.policy_loss)
        return state
    old, mfu = trainer._compute_old_log_prob(batch)
    entropy = agg_loss(loss_mat=old.batch["entropys"], loss_mask=batch.batch["response_mask"],
                       loss_agg_mode=actor.loss_agg_mode, loss_scale_factor=actor.loss_scale_factor)
    state.metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": mfu})
    old.batch.pop("entropys")
    batch = batch.union(old)
    if "rollout_log_probs" in batch.batch:
        from verl.utils.debug.metrics import calculate_debug_metrics

        state.metrics.update(calculate_debug_metrics(batch))
    state.batch = batch
    return state


def reference_log_probs(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``ref``: the reference policy's log-probs, when the run has a reference (KL loss or KL reward)."""
    if trainer.use_reference_policy:
        state.batch = state.batch.union(trainer._compute_ref_log_prob(state.batch))
    return state


def critic_values(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``values``: a critic's values, when the estimator needs one (GAE)."""
    if trainer.use_critic:
        state.batch = state.batch.union(trainer._compute_values(state.batch))
    return state
