"""Self-Navigating's three stages of the step: ``experience_plan`` before the rollout, ``exp_mask`` before the
update, ``memory_summary`` after it. Each does nothing when the experience manager is off
(:attr:`AgentEvolverTrainer.experience` is None).

- ``experience_plan``: per rollout row, whether the episode gets retrieved experience and whether training
  strips it (:meth:`~agentevolver.module.exp_manager.ExperienceManager.plan`);
- ``exp_mask``: each row's flag (training context differs from generation context) as the per-token mask the
  ``exp_on_off`` loss reads, with its clip (:func:`exp_token_mask`);
- ``memory_summary``: every ``memory.updated_freq`` steps the episodes go to the memory service, in the
  background (:meth:`~agentevolver.module.exp_manager.ExperienceManager.after_step`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["exp_token_mask", "off_policy_mask", "plan_experience", "summarise_into_memory"]


def plan_experience(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``experience_plan``: the plan's columns on the rollout rows, and ``exp/*`` numbers of it."""
    if trainer.experience is not None:
        state.metrics.update(trainer.experience.plan(state.inputs, validate=False, step=state.step))
    return state


def off_policy_mask(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``exp_mask``: the per-token off-policy mask of every row (:func:`exp_token_mask`)."""
    exp_token_mask(state.batch, trainer.settings.exp_manager.off_cliprange_high)
    return state


def summarise_into_memory(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``memory_summary``: the step's episodes to the memory service when ``memory.updated_freq`` says so."""
    if trainer.experience is not None:
        state.metrics.update(trainer.experience.after_step(state.episodes, state.step))
    return state


def exp_token_mask(batch: Any, off_cliprange_high: float) -> None:
    """Each row's ``exp_mask`` (training context differs from generation context) as the per-token mask the
    ``exp_on_off`` loss reads, and its clip in ``meta_info`` (both travel to the actor). Rows without the
    column (the experience manager is off) get no mask: the loss then acts as verl's own."""
    flags = batch.non_tensor_batch.pop("exp_mask", None)
    if flags is None:
        return
    response_mask = batch.batch["response_mask"]
    per_sample = torch.as_tensor(np.asarray(flags, dtype=np.float32), device=response_mask.device)
    batch.batch["exp_mask"] = per_sample[:, None] * response_mask.to(torch.float32)
    batch.meta_info["exp_off_cliprange_high"] = float(off_cliprange_high)
