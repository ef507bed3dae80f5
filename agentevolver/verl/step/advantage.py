"""The step's advantage stage, and ADCA-GRPO as verl advantage estimator ``adca_grpo``.

One switch selects the estimator: ``algorithm.adv_estimator``. ``adca_grpo`` is registered in verl's
estimator registry (:func:`register`), so verl's own ``compute_advantage`` accepts the name; verl hands a
registered estimator only the rewards, the mask and the groups, so what it computes there is ADCA's outcome
part, plain GRPO (which is also the advantage of every sample the judge did not label). The step credit
comes from the judge's labels, which the ``judge`` stage puts just before this one, and is fused in by
:meth:`agentevolver.module.adv_processor.AdcaStage.advantages` (docs/adca.md).

:func:`advantages` is the stage (after ``rollout_correction`` over every row and ``kl_in_reward``, the rewards
trained on): it runs on the episode rows only, so each episode counts once in its group even when a
multi-sample context manager added rows for its earlier samples; those rows then take their episode's
advantage (:func:`agentevolver.verl.step.sample_rows.spread_advantages`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentevolver.config.estimators import ADCA_ESTIMATOR
from agentevolver.verl.step.sample_rows import spread_advantages

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["ADCA_ESTIMATOR", "advantages", "correct_rollout", "register", "rewards_trained_on"]


def adca_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                config: Any = None, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: ADCA's outcome part, verl's GRPO advantage over the same groups."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    norm = bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True
    return compute_grpo_outcome_advantage(token_level_rewards=token_level_rewards, response_mask=response_mask,
                                          index=index, norm_adv_by_std_in_grpo=norm)


def register() -> None:
    """``adca_grpo`` in verl's advantage-estimator registry (idempotent). The trainer registers it when it is
    built: the advantage runs in the trainer's process only, so no other process needs the name."""
    from verl.trainer.ppo import core_algos

    if core_algos.ADV_ESTIMATOR_REGISTRY.get(ADCA_ESTIMATOR) is not adca_grpo_outcome_advantage:
        core_algos.register_adv_est(ADCA_ESTIMATOR)(adca_grpo_outcome_advantage)


def correct_rollout(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``rollout_correction``: verl's importance weights / rejection of every row whose rollout log-probs
    differ from the trainer's (``algorithm.rollout_correction``; not in bypass mode, where the rollout's
    log-probs are the old ones), with its metrics."""
    rollout_corr = trainer.config.algorithm.get("rollout_correction", None)
    if rollout_corr is not None and "rollout_log_probs" in state.batch.batch and not trainer.bypass:
        from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

        state.batch, corr_metrics = compute_rollout_correction_and_add_to_batch(state.batch, rollout_corr)
        state.metrics.update(corr_metrics)
    return state


def rewards_trained_on(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``kl_in_reward``: the episodes' ``token_level_rewards``: their scores, minus verl's KL penalty when
    ``algorithm.use_kl_in_reward`` (with its ``actor/reward_kl_penalty*`` metrics)."""
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty

    algorithm = trainer.config.algorithm
    episodes = state.episodes
    if algorithm.use_kl_in_reward:
        episodes, kl_metrics = apply_kl_penalty(episodes, kl_ctrl=trainer.kl_ctrl_in_reward,
                                                kl_penalty=algorithm.kl_penalty)
        state.metrics.update(kl_metrics)
    else:
        episodes.batch["token_level_rewards"] = episodes.batch["token_level_scores"]
    state.episodes = episodes
    return state


def advantages(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``adv``: the episode rows' advantages (verl's ``compute_advantage`` for the configured estimator,
    then ADCA's step credit when the judge labelled this step), spread to the rows the step added for earlier
    samples (:func:`~agentevolver.verl.step.sample_rows.spread_advantages`)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    config = trainer.config
    algorithm = config.algorithm
    episodes = compute_advantage(
        state.episodes, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
        num_repeat=config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True), config=algorithm)
    state.metrics.update(trainer.adca.advantages(episodes, state.labels, state.step))
    if len(state.batch) == len(episodes):  # no earlier-sample rows: the episode rows are the batch
        state.batch = episodes
    else:
        state.metrics.update(spread_advantages(state.batch, episodes))
    state.episodes = episodes
    return state
