"""Stage ``gen``: the episodes. verl's agent-loop manager runs them through this project's agent loop
(:mod:`agentevolver.verl.agent_loop`), ``rollout.n`` per task; the rollout servers then sleep (their memory goes
back to the update; not in async training, where they generate the next steps meanwhile), and the episodes are joined onto their task rows. Rewards are the next stage's work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["generate"]


def generate(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``gen``: one row per episode, each joined onto its task's columns, with its ``response_mask``; the
    rollout's own time split (verl's ``agent_loop/*`` timings) goes into the step's timings."""
    output = trainer.async_rollout_manager.generate_sequences(state.inputs)
    if trainer.staleness_bound is None:  # async training keeps them generating through the update
        trainer.checkpoint_manager.sleep_replicas()
    state.timings.update(output.meta_info.pop("timing", {}))
    n = int(trainer.config.actor_rollout_ref.rollout.n)
    batch = state.batch.repeat(repeat_times=n, interleave=True).union(output)
    if "response_mask" not in batch.batch:
        from verl.trainer.ppo.ray_trainer import compute_response_mask

        batch.batch["response_mask"] = compute_response_mask(batch)
    state.inputs = None  # consumed: the rows now live in the batch
    state.batch = batch
    return state
