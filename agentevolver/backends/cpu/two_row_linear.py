"""Linear layers that never multiply a single row: one row is computed as two, then the copy is dropped.

Why: the CPU generator's ``batch_invariant_greedy`` decodes a greedy request beside other rows and needs the
row's numbers to be the same bits in any company. Measured on a 2-core AMD EPYC in bf16 (SmolLM2-135M's
shapes): a matrix product gives a row the same bits for every row count from 2 to 69 and any position, but a
single row goes to another kernel, which rounds differently now and then (the 1536 -> 576 projection: 7 of 50
random rows differed in the last bit, and through 30 layers a greedy token flipped). A batch of one row
happens all the time: a request's prefill keeps only its last position's logits, and the last row of a
stream decodes alone. Computing that row twice costs little (a decode step reads the weights either way) and
keeps every product on the kernel that does not care about company.

:func:`install` replaces ``forward`` on a model's ``nn.Linear`` modules (their weights untouched).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.nn import functional

__all__ = ["install"]


def _two_row_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    features = x.shape[-1]
    if x.numel() != features:
        return functional.linear(x, self.weight, self.bias)
    row = x.reshape(1, features)
    out = functional.linear(torch.cat([row, row]), self.weight, self.bias)[:1]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def install(model: Any) -> int:
    """Give every ``nn.Linear`` of ``model`` the two-row forward; return how many were changed."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and getattr(module.forward, "__func__", None) is not _two_row_forward:
            module.forward = types.MethodType(_two_row_forward, module)
            changed += 1
    return changed
