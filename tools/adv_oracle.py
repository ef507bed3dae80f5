"""The ADCA-GRPO maths written the straightforward way: one Python loop iteration per sample.

Not used in training, so not in the runtime package. It exists as the oracle the tests (and the GPU kernel
check, :mod:`tools.gpu_kernel_check`) hold :func:`agentevolver.module.adv_processor.adca_grpo.prm_grpo_advantages`
to (two independent writings of the same formulas agreeing is the check that the index tricks are right)
and as the baseline ``bench/advantage.py`` times it against. It mirrors how the reference computes it:
per-sample lists of step rewards, group statistics in dicts, per-sample suffix sums, and a per-sample
masked assignment to broadcast step advantages onto tokens.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

from agentevolver.module.adv_processor.adca_grpo import AdcaHyper

__all__ = ["naive_prm_grpo_advantages"]


def naive_prm_grpo_advantages(
    step_ids: torch.Tensor,
    response_mask: torch.Tensor,
    outcomes: Sequence[float],
    groups: Sequence[Hashable],
    step_flags: Sequence[Sequence[bool] | None],
    fallback_advantages: torch.Tensor | None,
    hyper: AdcaHyper,
) -> torch.Tensor:
    """(B, L) advantages; same arguments and meaning as ``prm_grpo_advantages`` (groups as any labels)."""
    size, length = step_ids.shape
    eps = hyper.epsilon
    steps = [max(int(step_ids[i].max()) + 1, 0) if length else 0 for i in range(size)]
    rows = [step_flags[i] is not None and steps[i] > 0 for i in range(size)]
    norm_group = list(groups) if hyper.equal_trajectory_weight else [0] * size

    raw: list[list[float]] = []
    for i in range(size):
        if not rows[i]:
            raw.append([])
            continue
        flags = list(step_flags[i] or [])
        if hyper.prm_scheme == "decouple":
            raw.append([hyper.fix_base if f else -hyper.fix_base for f in flags])
        else:
            success = outcomes[i] > 0
            weights = [1.0 if f == success else hyper.allocation_inconsistent_weight for f in flags]
            sign = 1.0 if success else -1.0
            raw.append([sign * w / sum(weights) for w in weights])

    members: dict[Hashable, list[int]] = defaultdict(list)
    for i in range(size):
        members[norm_group[i]].append(i)

    z: list[list[float]] = [[] for _ in range(size)]
    for idxs in members.values():
        labelled = [i for i in idxs if rows[i]]
        if not labelled:
            continue
        values = [v for i in labelled for v in raw[i]]
        if max(values) == min(values):
            for i in labelled:
                z[i] = [0.0] * len(raw[i])
            continue
        if hyper.equal_trajectory_weight:
            mean = sum(sum(raw[i]) / len(raw[i]) for i in labelled) / len(labelled)
            var = sum(sum((v - mean) ** 2 for v in raw[i]) / len(raw[i]) for i in labelled) / len(labelled)
        else:
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / len(values)
        for i in labelled:
            z[i] = [(v - mean) / (math.sqrt(var) + eps) for v in raw[i]]

    orm = [0.0] * size
    for idxs in members.values():
        scores = [float(outcomes[i]) for i in idxs]
        mean, std = (0.0, 1.0) if len(scores) == 1 else (statistics.fmean(scores), statistics.stdev(scores))
        for i in idxs:
            centred = float(outcomes[i]) - mean
            orm[i] = centred / (std + eps) if hyper.norm_adv_by_std else centred

    out = torch.zeros(size, length, dtype=torch.float32)
    mask = response_mask.to(torch.float32)
    for i in range(size):
        if not rows[i]:
            if fallback_advantages is not None:
                out[i] = fallback_advantages[i].to(torch.float32)
            else:
                out[i] = orm[i] * mask[i]
            continue
        count = steps[i]
        fused = []
        for j in range(count):
            orm_part = orm[i] if hyper.orm_distribution == "all_steps" or j == count - 1 else 0.0
            value = hyper.alpha * z[i][j] + orm_part
            if hyper.enable_length_normalization:
                value /= math.sqrt(count)
            fused.append(value)
        suffix = [0.0] * count
        running = 0.0
        for j in range(count - 1, -1, -1):
            running += fused[j]
            suffix[j] = running
        adv = torch.tensor(suffix, dtype=torch.float32)
        sid = step_ids[i]
        valid = sid >= 0
        out[i, valid] = adv[sid[valid]]
        out[i] *= mask[i]
    return out
