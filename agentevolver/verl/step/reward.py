"""Stage ``reward``: each episode's reward as ``token_level_scores``.

The agent loop already scored every episode (the environment's ``/evaluate``, or a synthetic task's grader,
plus a custom reward function where configured: :mod:`agentevolver.verl.custom_reward`), and verl's
``extract_reward`` reads those scores from the rows. A colocated reward model (``reward_model.enable``) scores
the rows here first. Extra reward fields (``reward_extra_info``) become columns of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["score"]


def score(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``reward``: ``token_level_scores`` of every episode row (module docstring)."""
    from verl.trainer.ppo.reward import extract_reward

    batch = state.batch
    if trainer.use_rm and "rm_scores" not in batch.batch:
        batch.union(trainer.reward_loop_manager.compute_rm_score(batch))
    scores, extra = extract_reward(batch)
    if extra:
        batch.non_tensor_batch.update({key: np.array(values) for key, values in extra.items()})
    batch.batch["token_level_scores"] = scores
    return state
