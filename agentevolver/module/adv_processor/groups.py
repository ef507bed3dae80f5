"""GRPO group statistics in plain torch, so the advantage maths needs no verl import.

Written here rather than imported from ``verl.utils.groupwise`` because ``agentevolver/module`` holds the
mechanisms without verl (everything that touches verl lives in :mod:`agentevolver.verl`). The statistics
are the ones verl's GRPO uses, so ADCA's outcome part equals verl's GRPO advantage (tested against verl in
tests/test_adv_processor.py): per-group mean, unbiased std, and mean 0 / std 1 for a group of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["group_index", "group_mean_std"]


def group_index(labels: Sequence[Any] | np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """(N,) long tensor of contiguous group ids 0..G-1 for arbitrary labels (verl's ``uid`` strings)."""
    values = np.asarray([str(label) for label in labels], dtype=object)
    if values.size == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    _, inverse = np.unique(values, return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64, copy=False)).to(device)


@torch.no_grad()
def group_mean_std(scores: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean and unbiased std of ``scores`` (N,) over ``index`` (N,); (G,) float32 each."""
    scores = scores.reshape(-1).to(torch.float32)
    index = index.reshape(-1).to(device=scores.device, dtype=torch.long)
    if scores.numel() != index.numel():
        raise ValueError(f"scores has {scores.numel()} entries but index has {index.numel()}")
    groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.zeros(groups, dtype=torch.float32, device=scores.device).index_add_(0, index, torch.ones_like(scores))
    mean = torch.zeros(groups, dtype=torch.float32, device=scores.device).index_add_(0, index, scores)
    mean = mean / count.clamp_min(1.0)
    centred = scores - mean[index]
    var = torch.zeros(groups, dtype=torch.float32, device=scores.device).index_add_(0, index, centred * centred)
    std = (var / (count - 1.0).clamp_min(1.0)).clamp_min(0.0).sqrt()
    single = count <= 1.0
    return torch.where(single, 0.0, mean), torch.where(single, 1.0, std)
