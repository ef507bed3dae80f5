r"""ADCA-GRPO: step labels + outcomes -> token advantages, in a few batched tensor operations.

Notation: sample :math:`i` of the batch has :math:`K_i` steps (``max(step_ids_i) + 1``), outcome
:math:`s_i` (the sum of its ``token_level_rewards``, exactly what GRPO normalises), GRPO group :math:`g(i)`
(verl's ``uid``) and, when the judge labelled it, a flag :math:`f_{ij} \in \{GOOD, BAD\}` per step.

1. Raw process reward per step.

   * ``decouple``:   :math:`r_{ij} = +b` if GOOD else :math:`-b` (:math:`b` = ``fix_base``).
   * ``allocation``: the trajectory's outcome sign :math:`\sigma_i = +1` if :math:`s_i > 0` else
     :math:`-1` is split over its steps: :math:`r_{ij} = \sigma_i w_{ij} / \sum_k w_{ik}` with
     :math:`w_{ij} = 1` when the label agrees with the outcome (GOOD in a success, BAD in a failure) and
     :math:`w_{ij} = \lambda` (``allocation_inconsistent_weight``) when it disagrees; :math:`\sum_j r_{ij} =
     \sigma_i`.

2. Process z-score, per normalisation group :math:`G` (the GRPO group when ``equal_trajectory_weight``,
   else one group for the whole batch), over the labelled steps, with step weights :math:`\omega_{ij} =
   1/K_i` (every trajectory weighs the same) or :math:`1` (pooled: every step weighs the same):

   .. math:: \mu_G = \frac{\sum \omega_{ij} r_{ij}}{\sum \omega_{ij}},\quad
             \sigma_G^2 = \frac{\sum \omega_{ij} (r_{ij}-\mu_G)^2}{\sum \omega_{ij}},\quad
             z_{ij} = \frac{r_{ij} - \mu_G}{\sigma_G + \epsilon}

   and :math:`z_{ij} = 0` in a group whose labelled steps all carry the same raw reward (no process signal;
   this avoids dividing rounding noise by :math:`\epsilon`). The z-score is scale-free, so ``fix_base``
   cancels: only the GOOD/BAD pattern matters.

3. Outcome z-score, exactly verl's GRPO normalisation over the same groups (``verl.utils.groupwise``:
   Bessel-corrected std, a singleton group has mean 0 and std 1): :math:`o_i = (s_i - m_G)/(sd_G +
   \epsilon)`, or :math:`s_i - m_G` when ``algorithm.norm_adv_by_std_in_grpo`` is false.

4. Fusion: :math:`c_{ij} = \alpha z_{ij} + o_i [j = K_i - 1]` (``last_step``) or :math:`\alpha z_{ij} + o_i`
   (``all_steps``), times :math:`1/\sqrt{K_i}` with ``enable_length_normalization``.

5. Step advantage = suffix sum (future reward from this step on): :math:`A_{ij} = \sum_{k \ge j} c_{ik}`.

6. Token advantage: :math:`a_{it} = A_{i,\,step\_id(t)}` for tokens with ``step_id >= 0`` and
   ``response_mask = 1``, else 0.

A sample without labels (the judge failed, or its transcript was missing) keeps its plain GRPO advantage
(the batch's ``advantages``). Invariant: with :math:`\alpha = 0`, ``last_step`` and no length normalisation,
step 4 leaves only :math:`o_i` on the last step, every suffix sum is :math:`o_i`, and the advantages equal
GRPO's exactly, token for token.

Everything runs as batched tensor operations over (batch x steps) and (batch x tokens): group statistics by
``index_add_``/``scatter_reduce_``, the suffix sum by ``flip/cumsum``, the broadcast by one indexed read. The
only Python loop is over samples when packing the judge's ragged label lists (:func:`pack_step_flags`) and
step ids that arrive as lists (:func:`step_ids_tensor`); none runs over tokens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from agentevolver.module.adv_processor.groups import group_index, group_mean_std

__all__ = [
    "EPSILON",
    "AdcaAdvantages",
    "AdcaHyper",
    "compute_prm_grpo_advantages",
    "cosine_alpha",
    "num_steps",
    "outcome_scores",
    "pack_step_flags",
    "prm_grpo_advantages",
    "step_ids_tensor",
]

#: verl's GRPO epsilon (``compute_grpo_outcome_advantage``): the same value keeps alpha = 0 equal to GRPO.
EPSILON = 1e-6


@dataclass(frozen=True)
class AdcaHyper:
    """The hyper-parameters of one advantage computation (``alpha`` is this step's, already decayed)."""

    prm_scheme: Literal["decouple", "allocation"] = "decouple"
    equal_trajectory_weight: bool = True
    fix_base: float = 0.2
    alpha: float = 0.1
    orm_distribution: Literal["last_step", "all_steps"] = "last_step"
    enable_length_normalization: bool = False
    allocation_inconsistent_weight: float = 0.2
    #: ``algorithm.norm_adv_by_std_in_grpo``: divide the outcome by its group std (GRPO) or not (Dr.GRPO).
    norm_adv_by_std: bool = True
    epsilon: float = EPSILON

    def __post_init__(self) -> None:
        if self.prm_scheme not in ("decouple", "allocation"):
            raise ValueError(f"prm_scheme must be decouple or allocation; got {self.prm_scheme!r}")
        if self.orm_distribution not in ("last_step", "all_steps"):
            raise ValueError(f"orm_distribution must be last_step or all_steps; got {self.orm_distribution!r}")
        if not self.fix_base > 0 or self.alpha < 0 or not 0 < self.allocation_inconsistent_weight <= 1:
            raise ValueError("need fix_base > 0, alpha >= 0 and 0 < allocation_inconsistent_weight <= 1; got "
                             f"{self.fix_base}, {self.alpha}, {self.allocation_inconsistent_weight}")


@dataclass
class AdcaAdvantages:
    """What :func:`prm_grpo_advantages` computed.

    ``advantages`` (B, L) token advantages; ``step_rewards`` (B, S) the fused rewards :math:`c_{ij}` and
    ``step_advantages`` (B, S) their suffix sums (0 beyond a sample's steps and for unlabelled samples);
    ``orm_scores`` (B,) the normalised outcomes :math:`o_i`; ``labelled`` (B,) which samples got ADCA
    advantages (the rest kept their GRPO ones); ``metrics`` the health numbers (``adca/...``).
    """

    advantages: torch.Tensor
    step_rewards: torch.Tensor
    step_advantages: torch.Tensor
    orm_scores: torch.Tensor
    labelled: torch.Tensor
    metrics: dict[str, float]


def cosine_alpha(alpha: float, alpha_min: float, step: int, total_steps: int) -> float:
    r"""Half-cosine decay: :math:`\alpha_t = \alpha_{min} + (\alpha - \alpha_{min})(1 + \cos \pi p)/2`.

    ``step`` is verl's 1-based ``global_steps``; :math:`p = \min(step - 1, T)/T`, so the first step uses
    ``alpha`` and every step after ``total_steps`` of them uses ``alpha_min``.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1; got {total_steps}")
    progress = min(max(step - 1, 0), total_steps) / total_steps
    return alpha_min + (alpha - alpha_min) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_ids_tensor(batch: Any) -> torch.Tensor:
    """The (B, L) step id of every response token, -1 for tokens of no step (padding included).

    Read from ``batch.batch["step_ids"]`` when the rollout put a tensor there, else from
    ``non_tensor_batch["step_ids"]``: our agent loop's rows are ``int32`` arrays already padded to the response
    width (stacked as they are); other loops' per-sample lists (or each ``episode_record["step_ids"]``) are
    padded on the right like ``responses``.
    """
    length = int(batch.batch["response_mask"].shape[1])
    device = batch.batch["response_mask"].device
    if "step_ids" in batch.batch:
        ids = batch.batch["step_ids"].to(device=device, dtype=torch.long)
        if ids.shape != batch.batch["response_mask"].shape:
            raise ValueError(f"batch['step_ids'] has shape {tuple(ids.shape)} but response_mask has "
                             f"{tuple(batch.batch['response_mask'].shape)}; they must align")
        return ids
    rows = batch.non_tensor_batch.get("step_ids")
    if rows is None:
        records = batch.non_tensor_batch.get("episode_record")
        if records is None:
            raise KeyError("ADCA needs each sample's step ids: batch.batch['step_ids'] (B, L), "
                           "non_tensor_batch['step_ids'] or non_tensor_batch['episode_record'][i]['step_ids'] "
                           "(the agentevolver agent loop provides the last two)")
        rows = [record.get("step_ids") or [] for record in records]
    if len(rows) and all(isinstance(row, np.ndarray) and row.shape == (length,) for row in rows):
        # our agent loop's rows: already padded to the response width, one stack makes the tensor
        return torch.from_numpy(np.stack(list(rows)).astype(np.int64, copy=False)).to(device)
    return ragged_to_padded([row if row is not None else () for row in rows], length, device)


def ragged_to_padded(rows: Sequence[Sequence[int]], length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Right-pad (and cut) per-sample id lists to a (B, length) long tensor filled with -1.

    One flat array and one masked scatter. ``np.ndarray`` rows are concatenated (a copy); Python lists are
    read in one ``np.fromiter`` over all items (about 2x faster than converting row by row).
    """
    cut = [row if len(row) <= length else row[:length] for row in rows]
    lengths = torch.tensor([len(row) for row in cut], dtype=torch.long)
    total = int(lengths.sum())
    out = torch.full((len(cut), length), -1, dtype=torch.long)
    if total:
        if all(isinstance(row, np.ndarray) for row in cut):
            flat = np.concatenate(cut).astype(np.int64, copy=False)
        else:
            flat = np.fromiter(itertools.chain.from_iterable(cut), dtype=np.int64, count=total)
        out.masked_scatter_(torch.arange(length)[None, :] < lengths[:, None], torch.from_numpy(flat))
    return out.to(device)


def num_steps(step_ids: torch.Tensor) -> torch.Tensor:
    """(B,) steps per sample: ``max(step_ids) + 1``, 0 for a sample with no step token."""
    if step_ids.shape[1] == 0:
        return torch.zeros(step_ids.shape[0], dtype=torch.long, device=step_ids.device)
    return (step_ids.amax(dim=1) + 1).clamp(min=0)


def outcome_scores(batch: Any) -> torch.Tensor:
    """(B,) each sample's outcome: the sum of its ``token_level_rewards`` (what GRPO normalises); before the
    advantage stage has set them (the judge runs just before it), the sum of the ``token_level_scores``, which
    they equal unless ``algorithm.use_kl_in_reward`` subtracts a KL penalty."""
    for key in ("token_level_rewards", "token_level_scores"):
        if key in batch.batch:
            return batch.batch[key].sum(dim=-1)
    raise KeyError("ADCA needs batch.batch['token_level_rewards'] or ['token_level_scores'] (the trainer sets the "
                   "scores after the rollout); call it after the rollout's rewards and before the actor update")


def grpo_outcome_scalar(batch: Any, *, norm_adv_by_std: bool = True, epsilon: float = EPSILON) -> torch.Tensor:
    """(B,) each sample's GRPO advantage before any is computed: its outcome normalised within its group
    (``uid``), as verl's GRPO does (step 3 of the module docstring). The judge's skip rule reads it."""
    uid = batch.non_tensor_batch["uid"]
    score = outcome_scores(batch).to(torch.float32)
    index = group_index(uid, device=score.device)
    mean, std = group_mean_std(score, index)
    out = score - mean[index]
    return out / (std[index] + epsilon) if norm_adv_by_std else out


def pack_step_flags(
    step_flags: Sequence[Sequence[bool] | None], steps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged labels -> ``flags`` (B, S) bool (True = GOOD) and ``labelled`` (B,) bool.

    ``step_flags[i]`` is None for a sample without labels (it keeps its GRPO advantage), else exactly
    ``steps[i]`` booleans; a length mismatch is a caller bug and raises naming the sample.
    """
    counts = steps.tolist()
    if len(step_flags) != len(counts):
        raise ValueError(f"got {len(step_flags)} step-flag lists for a batch of {len(counts)} samples")
    width = max([*counts, 1])
    labelled = [flags is not None for flags in step_flags]
    for index, (flags, count) in enumerate(zip(step_flags, counts, strict=True)):
        if flags is not None and len(flags) != count:
            raise ValueError(f"step_flags[{index}] has {len(flags)} labels but sample {index} has {count} "
                             f"step(s) (step_ids 0..{count - 1}); give one label per step or None")
    lengths = torch.tensor([count if ok else 0 for ok, count in zip(labelled, counts, strict=True)],
                           dtype=torch.long)
    flat = [bool(v) for flags in step_flags if flags is not None for v in flags]
    packed = torch.zeros(len(counts), width, dtype=torch.bool)
    if flat:
        packed.masked_scatter_(torch.arange(width)[None, :] < lengths[:, None], torch.tensor(flat))
    return packed.to(steps.device), torch.tensor(labelled, dtype=torch.bool, device=steps.device)


def prm_grpo_advantages(
    step_ids: torch.Tensor,
    response_mask: torch.Tensor,
    outcomes: torch.Tensor,
    group_index: torch.Tensor,
    flags: torch.Tensor,
    labelled: torch.Tensor,
    fallback_advantages: torch.Tensor | None,
    hyper: AdcaHyper,
    *,
    steps: torch.Tensor | None = None,
) -> AdcaAdvantages:
    """The tensor core (see the module docstring for the maths).

    ``step_ids`` (B, L) long, -1 = no step; ``response_mask`` (B, L); ``outcomes`` (B,); ``group_index``
    (B,) long GRPO group ids in 0..G-1; ``flags`` (B, S) bool with S >= max steps; ``labelled`` (B,) bool;
    ``fallback_advantages`` (B, L) for unlabelled samples (None = the normalised outcome on every policy
    token, which is GRPO's advantage when the groups are GRPO's).
    """
    device = step_ids.device
    batch_size, _ = step_ids.shape
    steps = num_steps(step_ids) if steps is None else steps.to(device)
    width = flags.shape[1]
    if batch_size and int(steps.max()) > width:
        raise ValueError(f"flags have {width} columns but a sample has {int(steps.max())} steps")
    f64 = torch.float64
    cols = torch.arange(width, device=device)
    valid = cols[None, :] < steps[:, None]
    rows = labelled.to(device) & (steps > 0)
    cells = valid & rows[:, None]
    cellf = cells.to(f64)
    flags = flags.to(device)
    success = outcomes.to(device) > 0

    # 1. raw process rewards
    if hyper.prm_scheme == "decouple":
        raw = torch.where(flags, hyper.fix_base, -hyper.fix_base).to(f64)
    else:
        agrees = flags == success[:, None]
        weight = torch.where(agrees, 1.0, hyper.allocation_inconsistent_weight).to(f64) * cellf
        sign = torch.where(success, 1.0, -1.0).to(f64)
        raw = sign[:, None] * weight / weight.sum(dim=1, keepdim=True).clamp_min(1e-30)
    raw = raw * cellf

    # 2. process z-score per normalisation group
    group = group_index.to(device=device, dtype=torch.long) if hyper.equal_trajectory_weight \
        else torch.zeros(batch_size, dtype=torch.long, device=device)
    num_groups = int(group.max()) + 1 if batch_size else 0
    step_weight = (1.0 / steps.clamp(min=1).to(f64))[:, None] * cellf if hyper.equal_trajectory_weight else cellf
    cell_group = group[:, None].expand(batch_size, width).reshape(-1)
    total_weight = torch.zeros(num_groups, dtype=f64, device=device).index_add_(0, cell_group, step_weight.reshape(-1))
    mean = torch.zeros(num_groups, dtype=f64, device=device).index_add_(
        0, cell_group, (step_weight * raw).reshape(-1)) / total_weight.clamp_min(1e-30)
    centred = (raw - mean[group][:, None]) * cellf
    var = torch.zeros(num_groups, dtype=f64, device=device).index_add_(
        0, cell_group, (step_weight * centred * centred).reshape(-1)) / total_weight.clamp_min(1e-30)
    high = torch.full((num_groups,), -math.inf, dtype=f64, device=device).scatter_reduce_(
        0, cell_group, torch.where(cells, raw, -math.inf).reshape(-1), reduce="amax")
    low = torch.full((num_groups,), math.inf, dtype=f64, device=device).scatter_reduce_(
        0, cell_group, torch.where(cells, raw, math.inf).reshape(-1), reduce="amin")
    spread = (high > low)[group]
    z = centred / (var.sqrt()[group] + hyper.epsilon)[:, None]
    z = torch.where(spread[:, None] & cells, z, 0.0)

    # 3. outcome z-score: verl's GRPO normalisation over the same groups
    orm_group = group
    score = outcomes.to(device=device, dtype=torch.float32)
    group_mean, group_std = group_mean_std(score, orm_group)
    orm = score - group_mean[orm_group]
    if hyper.norm_adv_by_std:
        orm = orm / (group_std[orm_group] + hyper.epsilon)

    # 4. fusion, 5. suffix sum
    last = cols[None, :] == (steps - 1)[:, None]
    orm_cells = (last if hyper.orm_distribution == "last_step" else valid) & rows[:, None]
    fused = hyper.alpha * z + orm.to(f64)[:, None] * orm_cells.to(f64)
    if hyper.enable_length_normalization:
        fused = fused / steps.clamp(min=1).to(f64).sqrt()[:, None]
    fused = fused * cellf
    step_adv = fused.flip(1).cumsum(1).flip(1)

    # 6. broadcast to tokens through step_ids
    # The table's last column is 0 and step id -1 indexes it (negative indices wrap), so the tokens cost one
    # indexed read and one in-place mask multiply; no index tensor is built (at 1024 x 8192 tokens every
    # extra (B, L) temporary costs more than the arithmetic).
    table = torch.cat([step_adv.to(torch.float32), torch.zeros(batch_size, 1, dtype=torch.float32, device=device)], 1)
    advantages = table[torch.arange(batch_size, device=device)[:, None], step_ids].mul_(response_mask)
    unlabelled = (~rows).nonzero().squeeze(1)
    if unlabelled.numel():
        if fallback_advantages is None:
            advantages[unlabelled] = orm[unlabelled, None] * response_mask[unlabelled].to(torch.float32)
        else:
            advantages[unlabelled] = fallback_advantages[unlabelled].to(device=device, dtype=torch.float32)

    metrics = _health(z, orm, step_adv, flags, cells, rows, steps, success, hyper)
    return AdcaAdvantages(advantages=advantages, step_rewards=fused, step_advantages=step_adv,
                          orm_scores=orm, labelled=rows, metrics=metrics)


def _health(
    z: torch.Tensor,
    orm: torch.Tensor,
    step_adv: torch.Tensor,
    flags: torch.Tensor,
    cells: torch.Tensor,
    rows: torch.Tensor,
    steps: torch.Tensor,
    success: torch.Tensor,
    hyper: AdcaHyper,
) -> dict[str, float]:
    """The attribution health numbers over the labelled samples (docs/adca.md, "Metrics").

    ``outcome_share_last_mean``: mean of :math:`|o_i| / (|o_i| + \\alpha \\sum_j |z_{ij}|)`, how much of the
    last step's reward is outcome (samples where both are 0 are left out); ``alpha_effective``: the batch's
    :math:`\\alpha \\sum |z|` over its total outcome mass (:math:`\\sum |o_i|`, times :math:`K_i` for
    ``all_steps``), i.e. the process-to-outcome ratio actually applied (absent when the outcome mass is 0);
    ``sum_step_reward_sign_agree``: share of samples whose summed step reward (:math:`A_{i0}`) has the sign
    of their outcome (+ if :math:`s_i > 0` else -).
    """
    count = int(rows.sum())
    metrics: dict[str, float] = {"adca/labelled_samples": float(count)}
    if count == 0:
        return metrics
    orm64 = orm.to(torch.float64)
    attribution = hyper.alpha * z.abs().sum(dim=1)
    outcome_last = orm64.abs()
    outcome_mass = outcome_last if hyper.orm_distribution == "last_step" else outcome_last * steps.to(torch.float64)
    denominator = outcome_last + attribution
    shared = rows & (denominator > 0)
    if bool(shared.any()):
        metrics["adca/outcome_share_last_mean"] = float((outcome_last[shared] / denominator[shared]).mean())
    mass = float(outcome_mass[rows].sum())
    if mass > 0:
        metrics["adca/alpha_effective"] = float(attribution[rows].sum()) / mass
    total = step_adv[:, 0] if step_adv.shape[1] else torch.zeros_like(orm64)
    agree = torch.where(success, total > 0, total < 0)
    metrics["adca/sum_step_reward_sign_agree"] = float(agree[rows].to(torch.float64).mean())
    good = (flags & cells).sum(dim=1)
    metrics["adca/good_step_rate"] = float(good.sum()) / max(float(cells.sum()), 1.0)
    bad = cells.sum(dim=1) - good
    positive, negative = rows & success, rows & ~success
    if bool(positive.any()):
        metrics["adca/pos_traj_good_majority_rate"] = float((good > bad)[positive].to(torch.float64).mean())
    if bool(negative.any()):
        metrics["adca/neg_traj_bad_majority_rate"] = float((bad >= good)[negative].to(torch.float64).mean())
    metrics["adca/steps_per_sample_mean"] = float(steps[rows].to(torch.float64).mean())
    return metrics


def compute_prm_grpo_advantages(
    batch: Any, step_flags: Sequence[Sequence[bool] | None], hyper: AdcaHyper
) -> AdcaAdvantages:
    """ADCA-GRPO advantages of a verl ``DataProto`` (it is not modified; :class:`AdcaStage` writes them).

    Reads ``response_mask``, ``token_level_rewards``, ``advantages`` (the GRPO fallback; optional),
    ``non_tensor_batch["uid"]`` (GRPO groups) and the step ids (:func:`step_ids_tensor`).
    """
    tensors: Mapping[str, torch.Tensor] = batch.batch
    if "response_mask" not in tensors:
        raise KeyError("ADCA needs batch.batch['response_mask']")
    uid = batch.non_tensor_batch.get("uid")
    if uid is None:
        raise KeyError("ADCA needs the GRPO group of each sample in non_tensor_batch['uid']")
    step_ids = step_ids_tensor(batch)
    mask = tensors["response_mask"]
    steps = num_steps(step_ids)
    flags, labelled = pack_step_flags(step_flags, steps)
    fallback = tensors.get("advantages", None)
    return prm_grpo_advantages(step_ids, mask, outcome_scores(batch), group_index(uid, device=mask.device),
                               flags, labelled, fallback, hyper, steps=steps)
