"""The on/off-policy PPO loss of Self-Navigating (seed 002, section 5), as verl policy loss ``exp_on_off``.

Experience is injected into a prompt at rollout time and, for ``discard`` tasks, stripped again before
training. The response tokens of such a sample were generated under a different context than the one the
actor now scores them in, so they are off-policy: their ratio ``pi(new ctx) / pi_old(old ctx)`` can sit far
from 1 without any update having happened. ``exp_mask`` (1.0 on those tokens) gives them their own
upper clip ``off_cliprange_high`` (run config ``exp_manager.off_cliprange_high``); every other token uses the
actor's ``clip_ratio_low/high``. Both branches keep verl's dual clip (``clip_ratio_c``) for negative
advantages, so with no exp token the loss is verl's ``vanilla`` loss bit for bit.

How ``exp_mask`` reaches the loss: verl's ``ppo_loss`` (``verl.workers.utils.losses``) hands a policy loss
only fixed fields (old log-probs, advantages, response mask, rollout-IS weights). :func:`exp_aware_ppo_loss`
wraps it: it reads ``exp_mask`` (a tensor of the training batch) and ``exp_off_cliprange_high`` (non-tensor
data, from ``DataProto.meta_info``) from the micro-batch, publishes them in the context variable
:data:`EXP_LOSS_INPUTS` for the duration of the call, and calls verl's ``ppo_loss`` unchanged; the policy
loss reads them back. A context variable (not a module global) keeps concurrent or nested calls apart.
The trainer gives verl's actor worker the wrapper through verl's own seam, ``set_loss_fn``
(:meth:`agentevolver.verl.step.trainer.AgentEvolverTrainer.init_workers`); nothing is patched.
"""

from __future__ import annotations

import contextvars
import logging
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from verl.trainer.ppo import core_algos
from verl.utils import torch_functional as verl_F

__all__ = [
    "EXP_LOSS_INPUTS",
    "EXP_MASK_KEY",
    "LOSS_NAME",
    "OFF_CLIP_KEY",
    "ExpLossInputs",
    "compute_policy_loss_exp_on_off",
    "exp_aware_ppo_loss",
    "register",
]

logger = logging.getLogger(__name__)

#: The name this loss is registered under in verl (``actor_rollout_ref.actor.policy_loss.loss_mode``).
LOSS_NAME = "exp_on_off"
#: Tensor key of the per-token off-policy mask in the training batch (shape of ``response_mask``).
EXP_MASK_KEY = "exp_mask"
#: Non-tensor key (from ``DataProto.meta_info``) of the off-policy upper clip.
OFF_CLIP_KEY = "exp_off_cliprange_high"


@dataclass(frozen=True)
class ExpLossInputs:
    """What :func:`exp_aware_ppo_loss` passes to the policy loss beside verl's fixed arguments."""

    exp_mask: torch.Tensor | None
    off_cliprange_high: float | None


#: Set by :func:`exp_aware_ppo_loss` while verl's ``ppo_loss`` runs; None outside such a call.
EXP_LOSS_INPUTS: contextvars.ContextVar[ExpLossInputs | None] = contextvars.ContextVar(
    "agentevolver_exp_loss_inputs", default=None
)


class _Branch(NamedTuple):
    """Per-token PPO losses of one clip range, and where each clip acted."""

    losses: torch.Tensor
    clipped: torch.Tensor  # the ratio clip changed the loss
    clipped_lower: torch.Tensor  # the dual clip (negative advantages) changed the loss


def _clipped_losses(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float, clip_ratio_c: float
) -> _Branch:
    """verl's vanilla PPO token loss (ratio clip, then dual clip where A < 0): same operations, same order."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    ppo = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.min(dual_bound, ppo), ppo)
    return _Branch(losses, torch.gt(clipped, unclipped), torch.gt(ppo, dual_bound) & negative)


def _mean_or_zero(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``values`` over ``mask``; 0.0 for an empty mask (a metric, not a NaN, for a batch without)."""
    if not bool(mask.any()):
        return 0.0
    return verl_F.masked_mean(values.float(), mask).detach().item()


def _check_exp_mask(exp_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``exp_mask`` as a bool tensor on ``response_mask``'s device, after checking its shape and values."""
    if exp_mask.is_nested:
        exp_mask = exp_mask.to_padded_tensor(0.0)
    if tuple(exp_mask.shape) != tuple(response_mask.shape):
        raise ValueError(
            f"{EXP_MASK_KEY} has shape {tuple(exp_mask.shape)} but response_mask has "
            f"{tuple(response_mask.shape)}; "
            f"{EXP_MASK_KEY} must mark the response tokens of the same batch (one value per response token)"
        )
    exp_mask = exp_mask.to(response_mask.device)
    if exp_mask.dtype != torch.bool:
        if not bool(((exp_mask == 0) | (exp_mask == 1)).all()):
            raise ValueError(
                f"{EXP_MASK_KEY} must hold only 0 and 1 (1 = off-policy token); got other values"
            )
        exp_mask = exp_mask != 0
    return exp_mask


def _check_off_clip(value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(
            f"off_cliprange_high must be a finite number >= 0 (exp_manager.off_cliprange_high, passed to the "
            f"loss as meta_info['{OFF_CLIP_KEY}']); got {value!r}"
        )
    return float(value)


def compute_policy_loss_exp_on_off(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    exp_mask: torch.Tensor | None = None,
    off_cliprange_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """PPO loss with the upper clip ``off_cliprange_high`` on tokens where ``exp_mask`` is 1.

    ``exp_mask`` and ``off_cliprange_high`` default to what :func:`exp_aware_ppo_loss` published in
    :data:`EXP_LOSS_INPUTS`; without either, every token is on-policy (the result is verl's ``vanilla``).
    Metrics: verl's vanilla ones (``pg_clipfrac`` counts each token's own clip), plus ``exp_token_frac``,
    ``on_pg_loss``/``off_pg_loss`` (mean trained token loss, i.e. after rollout-IS weights, over each kind
    of response token; 0.0 when the batch has none) and ``off_pg_clipfrac``.

    Raises:
        ValueError: no ``config``; ``exp_mask`` of another shape than ``response_mask`` or not 0/1; exp tokens
            but no ``off_cliprange_high``; ``off_cliprange_high`` not a number >= 0.
    """
    if config is None:
        raise ValueError(f"policy loss '{LOSS_NAME}' needs the actor config (clip ratios, global_batch_info)")
    published = EXP_LOSS_INPUTS.get()
    if published is not None:
        if exp_mask is None:
            exp_mask = published.exp_mask
        if off_cliprange_high is None:
            off_cliprange_high = published.off_cliprange_high

    clip_ratio = config.clip_ratio
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    clip_ratio_c = config.get("clip_ratio_c", 3.0)
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor.clip_ratio_c (dual-clip bound) must be > 1.0; got {clip_ratio_c}")

    mask = response_mask.bool()
    exp = _check_exp_mask(exp_mask, response_mask) if exp_mask is not None else torch.zeros_like(mask)
    exp_tokens = exp & mask
    if off_cliprange_high is None:
        if bool(exp_tokens.any()):
            raise ValueError(
                f"{EXP_MASK_KEY} marks {int(exp_tokens.sum())} response tokens as off-policy but no "
                "off_cliprange_high was given: set exp_manager.off_cliprange_high and put it into the "
                f"batch's meta_info['{OFF_CLIP_KEY}'] (or pass off_cliprange_high= to the loss)"
            )
        off_high = clip_ratio_high  # unused: no token takes the off branch
    else:
        off_high = _check_off_clip(off_cliprange_high)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    on = _clipped_losses(ratio, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c)
    off = _clipped_losses(ratio, advantages, clip_ratio_low, off_high, clip_ratio_c)

    # torch.where, not off * m + on * (1 - m): the same for a 0/1 mask, and exact (vanilla bit for bit, and
    # an inf/NaN in the unused branch cannot leak into a token through 0 * inf).
    pg_losses = torch.where(exp, off.losses, on.losses)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = core_algos.agg_loss(
        loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info
    )

    on_tokens = mask & ~exp
    clipped = torch.where(exp, off.clipped, on.clipped).float()  # each token by its own clip range
    clipped_lower = torch.where(exp, off.clipped_lower, on.clipped_lower).float()
    pg_metrics = {
        "actor/pg_clipfrac": verl_F.masked_mean(clipped, response_mask).detach().item(),
        "actor/ppo_kl": verl_F.masked_mean(-negative_approx_kl, response_mask).detach().item(),
        "actor/pg_clipfrac_lower": verl_F.masked_mean(clipped_lower, response_mask).detach().item(),
        "actor/exp_token_frac": _mean_or_zero(exp, mask),
        "actor/on_pg_loss": _mean_or_zero(pg_losses, on_tokens),
        "actor/off_pg_loss": _mean_or_zero(pg_losses, exp_tokens),
        "actor/off_pg_clipfrac": _mean_or_zero(off.clipped, exp_tokens),
    }
    return pg_loss, pg_metrics


def register() -> None:
    """Register the loss in verl's policy-loss registry as :data:`LOSS_NAME` (idempotent)."""
    if core_algos.POLICY_LOSS_REGISTRY.get(LOSS_NAME) is not compute_policy_loss_exp_on_off:
        core_algos.register_policy_loss(LOSS_NAME)(compute_policy_loss_exp_on_off)


# --- the ppo_loss wrapper --------------------------------------------------------------------------------

_warned_unused = False


def _read_off_clip(data: Any) -> float | None:
    from verl.utils import tensordict_utils as tu

    value = tu.get(data, OFF_CLIP_KEY, default=None)
    if isinstance(value, list):  # a per-sample stack after concatenating batches: one run-wide value expected
        distinct = set(value)
        if len(distinct) != 1:
            raise ValueError(
                f"non-tensor '{OFF_CLIP_KEY}' must be one value for the batch; got {sorted(distinct)}"
            )
        value = distinct.pop()
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    return None if value is None else _check_off_clip(value)


def _read_exp_mask(data: Any) -> torch.Tensor | None:
    if EXP_MASK_KEY not in data:
        return None
    exp_mask = data[EXP_MASK_KEY]
    if not isinstance(exp_mask, torch.Tensor):
        raise ValueError(
            f"'{EXP_MASK_KEY}' in the training batch must be a tensor; got {type(exp_mask).__name__}"
        )
    if exp_mask.is_nested:
        exp_mask = exp_mask.to_padded_tensor(0.0)
    response_mask = data["response_mask"]
    shape = tuple(response_mask.to_padded_tensor(0).shape if response_mask.is_nested else response_mask.shape)
    if tuple(exp_mask.shape) != shape:
        raise ValueError(
            f"'{EXP_MASK_KEY}' in the training batch has shape {tuple(exp_mask.shape)} but 'response_mask' "
            f"has {shape}; the trainer must build {EXP_MASK_KEY} over the same response tokens"
        )
    return exp_mask


def exp_aware_ppo_loss(
    config: Any, model_output: Any, data: Any, dp_group: Any = None
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's ``ppo_loss`` with the batch's ``exp_mask`` and ``exp_off_cliprange_high`` shown to the loss.

    Without ``exp_mask`` in ``data`` it is exactly verl's ``ppo_loss``. The values are published for this call
    only (and reset afterwards, also on error), so a later call never sees a stale mask.
    """
    from verl.workers.utils import losses

    global _warned_unused
    inputs = ExpLossInputs(exp_mask=_read_exp_mask(data), off_cliprange_high=_read_off_clip(data))
    if (
        not _warned_unused
        and inputs.exp_mask is not None
        and config.policy_loss.get("loss_mode", "vanilla") != LOSS_NAME
        and bool((inputs.exp_mask != 0).any())
    ):
        _warned_unused = True
        logger.warning(
            "the training batch marks off-policy tokens (%s) but actor.policy_loss.loss_mode is %r, not %r: "
            "they are trained with the on-policy clip",
            EXP_MASK_KEY,
            config.policy_loss.get("loss_mode"),
            LOSS_NAME,
        )
    token = EXP_LOSS_INPUTS.set(inputs)
    try:
        return losses.ppo_loss(config, model_output, data, dp_group=dp_group)
    finally:
        EXP_LOSS_INPUTS.reset(token)
