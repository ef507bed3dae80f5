"""Per-step episode numbers from a rollout batch: success, how episodes ended, errors, time split.

verl's own data metrics cover rewards, advantages and lengths; what an agent run also needs is how the
*episodes* went. The agent loop puts each episode's result into the batch (``termination``,
``reward_success_rate``, ``episode_metrics``, ...); this pure function reduces them to flat numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from agentevolver.module.agent_flow.episode import TERMINATIONS

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["episode_metrics", "record_episode_metrics"]

#: Per-episode metrics averaged over the batch (key in ``episode_metrics`` -> logged name).
_MEANS = {
    "episode/generated_tokens": "episode/generated_tokens_mean",
    "time/generate_s": "episode/time_generate_s_mean",
    "time/env_s": "episode/time_env_s_mean",
    "time/tool_s": "episode/time_tool_s_mean",
    "time/total_s": "episode/time_total_s_mean",
    # Self-Navigating: share of episodes that got experience, and of those trained without it (exp_mask).
    "exp/injected": "exp/injected_share",
    "exp/stripped": "exp/stripped_share",
    "time/memory_s": "exp/retrieve_s_mean",
}
#: Per-episode counts summed over the batch.
_SUMS = {
    "episode/env_errors": "episode/env_errors",
    "episode/parse_errors": "episode/parse_errors",
    "episode/mad_steps": "episode/mad_steps",
    "tool/calls": "episode/tool_calls",
    # Attempts run again because their environment failed (agent_flow.episode_retries).
    "episode/restarts": "episode/restarts",
    # Self-Navigating: retrievals that failed (the memory service was down or answered an error).
    "exp/retrieve_errors": "exp/retrieve_errors",
}


def record_episode_metrics(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``episode_metrics``: ``episode/*`` (and Self-Navigating's ``exp/*`` split) of the step's episodes."""
    state.metrics.update(episode_metrics(state.episodes.non_tensor_batch))
    return state


def episode_metrics(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """Success rate, termination shares, error counts and time split of the batch's episodes."""
    if "termination" not in non_tensor_batch:
        return {}
    terminations = [str(t) for t in non_tensor_batch["termination"]]
    count = len(terminations) or 1
    out: dict[str, float] = {"episode/count": float(len(terminations))}
    if "reward_success_rate" in non_tensor_batch:
        out["episode/success_rate"] = float(np.mean(np.asarray(non_tensor_batch["reward_success_rate"], dtype=float)))
    if "reward_madness" in non_tensor_batch:
        out["episode/madness_share"] = float(np.mean(np.asarray(non_tensor_batch["reward_madness"], dtype=float) < 0))
    for name in TERMINATIONS:
        out[f"episode/ended/{name}"] = sum(t == name for t in terminations) / count
    per_episode = [m for m in non_tensor_batch.get("episode_metrics", []) if isinstance(m, Mapping)]
    for key, name in _MEANS.items():
        values = [float(m[key]) for m in per_episode if key in m]
        if values:
            out[name] = float(np.mean(values))
    for key, name in _SUMS.items():
        out[name] = float(sum(float(m.get(key, 0.0)) for m in per_episode))
    out.update(_success_by_experience(non_tensor_batch))
    return out


def _success_by_experience(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """Self-Navigating: success of the episodes that ran with experience and of those without, in the same
    batch (``mixed`` gives both within each group); only when the batch holds episodes of both kinds."""
    successes, metrics = non_tensor_batch.get("reward_success_rate"), non_tensor_batch.get("episode_metrics")
    if successes is None or metrics is None:
        return {}
    split: dict[bool, list[float]] = {True: [], False: []}
    for success, episode in zip(successes, metrics, strict=True):
        if isinstance(episode, Mapping) and "exp/injected" in episode:
            split[bool(episode["exp/injected"])].append(float(success))
    if not split[True] or not split[False]:
        return {}
    return {"exp/success_with_experience": float(np.mean(split[True])),
            "exp/success_without_experience": float(np.mean(split[False]))}
