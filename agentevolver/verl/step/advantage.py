"""The step's advantage stage, and ADCA-GRPO as verl advantage estimator ``adca_grpo``.

One switch selects the estimator: ``algorithm.adv_estimator``. ``adca_grpo`` is registered in verl's
estimator registry (:func:`register`), so verl's own ``compute_advantage`` accepts the name; verl hands a
registered estimator only the rewards, the mask and the groups, so what it computes there is ADCA's outcome
part, plain GRPO (which is also the advantage of every sample the judge did not label). The step credit
comes from the judge's labels, which the ``judge`` stage puts just before this one, and is fused in by
:meth:`agentevolver.module.adv_processor.AdcaStage.advantages` (docs/adca.md).

:func:`episode_advantages` is the stage: it runs on the episode rows only, so each episode counts once in its
group even when a multi-sample context manager added rows for its earlier samples; those rows then take their
episode's advantage (:func:`agentevolver.verl.step.sample_rows.spread_advantages`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentevolver.module.adv_processor.stage import ADCA_ESTIMATOR

__all__ = ["ADCA_ESTIMATOR", "GRPO_ESTIMATORS", "episode_advantages", "register"]

#: Estimators whose advantages are plain GRPO: ADCA's outcome part (the old switch,
#: ``attribution_driven_credit_assignment.enable=true``, pairs with these).
GRPO_ESTIMATORS = frozenset({"grpo", "grpo_vectorized", ADCA_ESTIMATOR})


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


def episode_advantages(episodes: Any, *, config: Any, adca: Any, labels: Any, step: int,
                       kl_ctrl: Any = None) -> tuple[Any, dict[str, float]]:
    """The advantages of a batch of episode rows (one row per episode), and their metrics.

    verl's order within its ``adv`` stage: the rewards trained on (``token_level_rewards``: the scores, minus
    the KL penalty when ``algorithm.use_kl_in_reward``), then verl's ``compute_advantage`` for the configured
    estimator, then ADCA's step credit when the judge labelled this step.
    """
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage

    algorithm = config.algorithm
    metrics: dict[str, float] = {}
    if algorithm.use_kl_in_reward:
        episodes, kl_metrics = apply_kl_penalty(episodes, kl_ctrl=kl_ctrl, kl_penalty=algorithm.kl_penalty)
        metrics.update(kl_metrics)
    else:
        episodes.batch["token_level_rewards"] = episodes.batch["token_level_scores"]
    episodes = compute_advantage(
        episodes, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
        num_repeat=config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True), config=algorithm)
    metrics.update(adca.advantages(episodes, labels, step))
    return episodes, metrics
