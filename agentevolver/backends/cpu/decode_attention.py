"""Attention for the CPU generator: torch's SDPA, except for one-token decode steps, which use two matmuls.

Why: in a decode step each row has one query token against its whole cache. On CPU, torch's
``scaled_dot_product_attention`` sends that shape to its flash-attention kernel, which parallelises over
query blocks; with one query there is nothing to split. Profiled on SmolLM2-135M (16 rows, ~500 cached
tokens, bf16, 2 cores), that kernel was 63% of a 194 ms decode step for 18 MFLOP of work. transformers'
``eager`` attention is not the answer either: it first copies every key and value head
``num_key_value_groups`` times (grouped-query attention) and was 134 ms.

Here the query heads that share a key/value head are stacked as rows of one small matrix product per
key/value head: scores ``(B, kv_heads, groups, L)`` from ``q @ k^T``, a float32 softmax, then ``@ v``. No
cache tensor is copied, and each product is one batched GEMM of the right shape. The generator's growing
cache (:mod:`.kv_cache`) hands a decode step its whole buffers, spare columns included (contiguous: a bf16
GEMM copies a strided view first); the mask, padded here, hides the spare columns. Prefill (more than one
query token), training and anything with dropout go to transformers' own SDPA function unchanged.

:func:`install` registers the function (and SDPA's mask builder) under :data:`NAME` with transformers'
attention interfaces, and switches a loaded model to it; bench/precision.py measures the decode step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["NAME", "decode_attention_forward", "install"]

#: The attention implementation name this module registers.
NAME = "agentevolver_cpu_decode"


def decode_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query`` ``(B, heads, q, d)``, ``key``/``value`` ``(B, kv_heads, L, d)``;
    returns ``(B, q, heads, d)`` as transformers' SDPA function does."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or dropout > 0.0 or module.training or heads % kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    # query head h attends with key/value head h // groups (transformers' repeat_kv order)
    scores = torch.matmul(query.reshape(batch, kv_heads, groups, dim), key.transpose(-1, -2)).float() * scale
    if attention_mask is not None:  # SDPA's mask: bool (True = attend) or additive, (B, 1, 1, L)
        mask = attention_mask[..., -1:, : key.shape[2]]
        spare = key.shape[2] - mask.shape[-1]
        if spare > 0:  # a growing cache's whole buffer (.kv_cache): columns past the mask hold no token yet
            filler = False if mask.dtype == torch.bool else float("-inf")
            mask = torch.nn.functional.pad(mask, (0, spare), value=filler)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (B, kv_heads, groups, d)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def _always_a_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' SDPA mask, never skipped: where every column is real it would return None, and a decode
    step over a growing cache's whole buffer (:mod:`.kv_cache`) needs the mask to tell its real columns."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, decode_attention_forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _always_a_mask)


def install(model: Any) -> bool:
    """Switch a loaded transformers model from ``sdpa`` to this function; False (unchanged) for any other
    implementation, which the model's config chose on purpose."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(NAME)
    return True
