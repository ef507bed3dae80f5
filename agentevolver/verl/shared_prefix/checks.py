"""Driver-side checks of the shared-prompt switch (``actor_rollout_ref.actor.use_prefix_grouper``).

Why on the driver: the engine finds out only inside a worker, after the first rollout, that the model's
attention cannot take the block mask; a run should refuse that before any worker starts. Settings that make
sharing merely less effective (micro-batches that split a group, shuffled mini-batches) are warnings: the
result stays exact, only slower.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import OmegaConf

from agentevolver.errors import ConfigError
from agentevolver.verl.shared_prefix.layout import SUPPORTED_ATTENTION, SWITCH

__all__ = ["check_shared_prompts", "shared_prompt_warnings"]

logger = logging.getLogger(__name__)

_SWITCH = f"actor_rollout_ref.actor.{SWITCH}"


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    return OmegaConf.select(config, dotted, default=default)


def check_shared_prompts(config: Any) -> list[str]:
    """Raise :class:`ConfigError` when the switch is on with settings the shared forward cannot serve; return
    the warnings (also logged) for settings that only reduce how many prompts are shared."""
    if not bool(_get(config, _SWITCH, False)):
        return []
    attention = _get(config, "actor_rollout_ref.model.override_config.attn_implementation", None)
    if attention is not None and attention not in SUPPORTED_ATTENTION:
        raise ConfigError(
            f"{_SWITCH}=true (shared prompts) needs an attention implementation that takes a 4-D mask "
            f"({', '.join(SUPPORTED_ATTENTION)}); actor_rollout_ref.model.override_config.attn_implementation is "
            f"{attention!r}: set it to sdpa or set {_SWITCH}=false")
    if bool(_get(config, "actor_rollout_ref.model.use_fused_kernels", False)):
        raise ConfigError(
            f"{_SWITCH}=true (shared prompts) cannot run with actor_rollout_ref.model.use_fused_kernels=true "
            f"(the fused kernels compute log-probs from hidden states the grouped rows lay out differently); "
            f"turn one of them off")
    warnings = shared_prompt_warnings(config)
    for warning in warnings:
        logger.warning("%s", warning)
    return warnings


def shared_prompt_warnings(config: Any) -> list[str]:
    """Settings under which groups are split across micro-batches (each piece still shares its prompt)."""
    n = int(_get(config, "actor_rollout_ref.rollout.n", 1) or 1)
    if n < 2:
        return [f"{_SWITCH}=true but actor_rollout_ref.rollout.n={n}: no two samples share a prompt, so "
                f"nothing is shared (set it false to skip the grouping)"]
    found = []
    sizes = {
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": _get(
            config, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": _get(
            config, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": _get(
            config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    }
    if not bool(_get(config, "actor_rollout_ref.actor.use_dynamic_bsz", False)):
        for key, size in sizes.items():
            if size is not None and int(size) % n:
                found.append(f"{key}={size} is not a multiple of actor_rollout_ref.rollout.n={n}: GRPO groups are "
                             f"split across micro-batches and share their prompt only within each piece")
    if bool(_get(config, "actor_rollout_ref.actor.shuffle", False)):
        found.append("actor_rollout_ref.actor.shuffle=true mixes GRPO groups across micro-batches, so fewer "
                     "samples share a prompt in each forward")
    return found
