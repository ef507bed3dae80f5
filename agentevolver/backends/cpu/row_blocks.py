"""Linear layers whose every product has a row count this machine's kernels compute each row alike at.

Why: the CPU generator's ``batch_invariant_greedy`` decodes a greedy request beside other rows, and prefills
several greedy prompts' chunks in one pass, and needs each row's numbers to be the same bits in any company. A
matrix product gives a row the same bits whatever rows share it only inside a range of row counts, and the range
is the CPU's (oneDNN picks kernels and blockings by shape):

* a 2-core AMD EPYC in bf16 (AVX512-BF16): every row count from 2 up, but a single row takes another kernel,
  which rounds differently now and then (the 1536 -> 576 projection: 7 of 50 random rows differed in the last
  bit, and through 30 layers a greedy token flipped);
* a 2-core Intel Xeon in bf16 (AMX-BF16): 2 to 32 rows alike; from 33 rows on SmolLM2-135M's projections switch
  kernels and 1-58 of the first 64 rows change (the lm-head's 576 -> 49152 at 33 rows and beyond), so a
  lockstep prefill of five 64-token chunks (320 rows) differed from the same chunk alone;
* fp32 on either: kernels switch at 1, 2-4, 5-7... rows; no useful range.

So every product runs on at least 2 rows (a single row is computed twice and the copy dropped) and at most
:func:`probe_block_rows`'s block (more rows are cut into blocks of that many; a lone last row again as two). A
decode step reads the weights once per block, so the block is measured, not assumed: the largest of
:data:`CANDIDATES` at which every probed row count gives each row its two-row bits, on the model's own
weights. :func:`install` replaces ``forward`` on a model's ``nn.Linear`` modules (their weights untouched).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.nn import functional

__all__ = ["CANDIDATES", "PROBED_ROWS", "install", "probe_block_rows"]

#: Block sizes tried, largest first; below the smallest a batched greedy decode is not worth it (the generator
#: then decodes each greedy request alone, as its end-to-end probe decides).
CANDIDATES = (1024, 512, 256, 128, 64, 32, 16, 8)
#: Row counts the probe multiplies: both sides of the sizes where kernels are known to switch (powers of two,
#: their neighbours, AMX's 16-row tiles), up to the largest candidate.
PROBED_ROWS = (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256,
               257, 384, 511, 512, 513, 768, 1023, 1024)
#: Rows whose products are compared (each against itself computed as a two-row product).
_COMPARED = 64


def _pair(row: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """One row (``[1, in]``) as a two-row product, the copy dropped."""
    return functional.linear(torch.cat([row, row]), weight, bias)[:1]


def _blocked_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    features = x.shape[-1]
    rows = x.reshape(-1, features)
    count = rows.shape[0]
    block = self._row_block  # type: ignore[attr-defined]
    if 2 <= count <= block:
        return functional.linear(x, self.weight, self.bias)
    parts = [_pair(part, self.weight, self.bias) if part.shape[0] == 1
             else functional.linear(part, self.weight, self.bias)
             for part in rows.split(block)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def install(model: Any, block_rows: int = CANDIDATES[0]) -> int:
    """Give every ``nn.Linear`` of ``model`` the blocked forward (products of 2 to ``block_rows`` rows); return
    how many modules were changed (a module already blocked gets the new block size and is not counted)."""
    if block_rows < 2:
        raise ValueError(f"block_rows must be >= 2 (a product of one row is what this avoids); got {block_rows}")
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module._row_block = int(block_rows)
            if getattr(module.forward, "__func__", None) is not _blocked_forward:
                module.forward = types.MethodType(_blocked_forward, module)
                changed += 1
    return changed


@torch.inference_mode()
def probe_block_rows(model: Any, *, seed: int = 0) -> int | None:
    """The largest of :data:`CANDIDATES` at which every probed row count (:data:`PROBED_ROWS` up to it) gives each
    of the first rows the bits it gets as a two-row product, for every distinct linear layer shape of ``model``
    (its own weights, random inputs); None when not even the smallest passes. A fraction of a second for a 135M
    model (the lm-head's products dominate)."""
    generator = torch.Generator().manual_seed(seed)
    passed = {rows: True for rows in PROBED_ROWS}
    seen: set[tuple[int, int, torch.dtype, bool]] = set()
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        weight, bias = module.weight, module.bias
        shape = (weight.shape[1], weight.shape[0], weight.dtype, bias is not None)
        if shape in seen:
            continue
        seen.add(shape)
        x = torch.randn(PROBED_ROWS[-1], weight.shape[1], generator=generator).to(weight.dtype)
        reference = torch.cat([_pair(x[i:i + 1], weight, bias) for i in range(_COMPARED)])
        for rows in PROBED_ROWS:
            if passed[rows]:
                compared = min(rows, _COMPARED)
                passed[rows] = torch.equal(functional.linear(x[:rows], weight, bias)[:compared],
                                           reference[:compared])
    for block in CANDIDATES:
        if all(ok for rows, ok in passed.items() if rows <= block):
            return block
    return None
