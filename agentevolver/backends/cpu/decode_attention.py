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
:func:`exact_rows` makes a model's decode steps give each row the same bits in any company (the
``probs @ v`` over a window per row), for the generator's ``batch_invariant_greedy``.

:func:`install` registers the function (and SDPA's mask builder) under :data:`NAME` with transformers'
attention interfaces, and switches a loaded model to it; bench/precision.py measures the decode step.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["EXACT_ROWS", "MAX_QUERIES", "NAME", "decode_attention_forward", "draft_blocks", "install", "takes_block"]

#: The attention implementation name this module registers.
NAME = "agentevolver_cpu_decode"
#: Attribute on an attention module that makes its decode steps compute each row over exactly its own columns.
EXACT_ROWS = "agentevolver_exact_rows"
#: Most query tokens per row taken by the decode path inside :func:`draft_blocks` (a speculative step's sampled
#: token plus its drafts); a longer block goes to SDPA.
MAX_QUERIES = 17

#: Whether this thread's forward passes are speculative decode steps (:func:`draft_blocks`); anything else with
#: more than one query token (prefills, however short) keeps SDPA, so their numbers are what they were.
_blocks = threading.local()


@contextlib.contextmanager
def draft_blocks(max_queries: int = MAX_QUERIES) -> Iterator[None]:
    """Within it, this thread's forward passes of 2 to ``max_queries`` query tokens per row take the decode
    path (:func:`_few_queries`) instead of SDPA: the generator's speculative steps, where SDPA's CPU kernel
    would cost several plain decode steps."""
    previous = getattr(_blocks, "limit", 1)
    _blocks.limit = max_queries
    try:
        yield
    finally:
        _blocks.limit = previous


def takes_block(q_len: int) -> bool:
    """Whether a forward pass of ``q_len`` query tokens per row, on this thread now, takes the decode path: one
    token always, 2 to :data:`MAX_QUERIES` inside :func:`draft_blocks`. The growing cache (:mod:`.kv_cache`)
    then hands it its whole buffers, as it does a one-token step, instead of contiguous copies for SDPA."""
    return q_len == 1 or q_len <= getattr(_blocks, "limit", 1)


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
    if not takes_block(q_len) or dropout > 0.0 or module.training or heads % kv_heads \
            or (q_len > 1 and attention_mask is None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    groups = heads // kv_heads
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    if q_len > 1:
        return _few_queries(query, key, value, attention_mask, groups, scale), None
    # query head h attends with key/value head h // groups (transformers' repeat_kv order)
    scores = _masked_scores(query.reshape(batch, kv_heads, groups, dim), key, attention_mask, 1, scale)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    if getattr(module, EXACT_ROWS, False) and attention_mask is not None:
        out = _rows_exactly(probs, value, attention_mask)
    else:
        out = torch.matmul(probs, value)  # (B, kv_heads, groups, d)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


#: (mask, first real columns, last real columns) of the last mask seen: every layer of a forward pass gets the
#: same mask tensor, so its row spans are found once per decode step, not once per layer (the mask is held
#: here, so no later tensor can take its place while it is compared by identity)
_spans: tuple[torch.Tensor, list[int], list[int]] | None = None


def _mask_over(attention_mask: torch.Tensor, q_len: int, length: int) -> torch.Tensor:
    """SDPA's mask rows of the last ``q_len`` queries, over exactly ``length`` key columns: a growing cache's whole
    buffer (.kv_cache) is longer than the mask, and the columns past it hold no token yet (hidden)."""
    mask = attention_mask[..., -q_len:, :length]
    spare = length - mask.shape[-1]
    if spare > 0:
        mask = torch.nn.functional.pad(mask, (0, spare), value=False if mask.dtype == torch.bool else float("-inf"))
    return mask


#: (mask, q_len, length, float32 bias) of the last bool mask seen: every layer of a forward pass gets the same mask
#: tensor, so its padded additive form is built once per pass, not once per layer
_biases: tuple[torch.Tensor, int, int, torch.Tensor] | None = None


def _mask_bias(attention_mask: torch.Tensor, q_len: int, length: int) -> torch.Tensor:
    """A bool mask's ``_mask_over`` as a float32 bias, ``(B, 1, q, L)``: 0 where a query attends, -inf elsewhere."""
    global _biases
    seen = _biases
    if seen is not None and seen[0] is attention_mask and seen[1] == q_len and seen[2] == length:
        return seen[3]
    mask = _mask_over(attention_mask, q_len, length)
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
    _biases = (attention_mask, q_len, length, bias)
    return bias


def _masked_scores(queries: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, q_len: int,
                   scale: float, *, groups: int | None = None) -> torch.Tensor:
    """Float32 attention scores ``(queries @ key^T) * scale``, masked: ``(B, kv_heads, rows, L)``, or
    ``(B, kv_heads, groups, q_len, L)`` when ``groups`` is given (the query rows stacked head-major).

    Why not convert, scale and mask in three passes: each reads and writes 4 bytes a score, and a speculative
    block of q_len tokens has q_len times a decode step's scores. Here a bool mask becomes a float32 bias once
    per forward pass, and one mixed-dtype add converts, scales and masks: ``bias + scale * scores``. A
    power-of-two scale (1/8 for SmolLM2's head size 64) is applied to the few queries instead, where it moves
    only exponents. Either way the bits are those of scaling and masking the float32 scores.
    """
    exact = math.frexp(scale)[0] == 0.5
    scores = torch.matmul(queries * scale if exact else queries, key.transpose(-1, -2))
    if groups is not None:
        scores = scores.view(*scores.shape[:2], groups, q_len, scores.shape[-1])
    if attention_mask is None:
        return scores.float() if exact else scores.float().mul_(scale)
    if attention_mask.dtype == torch.bool:  # SDPA's mask: bool (True = attend) or additive, (B, 1, q, L)
        bias = _mask_bias(attention_mask, q_len, key.shape[2])
        return torch.add(bias[:, :, None] if groups is not None else bias, scores, alpha=1.0 if exact else scale)
    mask = _mask_over(attention_mask, q_len, key.shape[2]).float()
    scores = scores.float() if exact else scores.float().mul_(scale)
    return scores.add_(mask[:, :, None] if groups is not None else mask)


def _few_queries(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
                 groups: int, scale: float) -> torch.Tensor:
    """A decode step that feeds a row several tokens (speculative decoding's drafts, the generator's
    ``draft_tokens``): as the one-token step, with every query position of a key/value head's query heads
    stacked as rows of its product, and SDPA's mask ``(B, 1, q, L)`` (causal within the block) per position.
    Returns ``(B, q, heads, d)``."""
    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    stacked = query.reshape(batch, kv_heads, groups * q_len, dim)  # head h = kv * groups + g, then position
    # the one-token step's arithmetic (float32 scores, scaled, masked, softmax): with q_len rows per head the
    # scores are q_len times a decode step's, so every pass over them counts (_masked_scores)
    scores = _masked_scores(stacked, key, attention_mask, q_len, scale, groups=groups)
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, groups * q_len, length)
    out = torch.matmul(probs, value)  # (B, kv_heads, groups * q, d)
    return out.view(batch, heads, q_len, dim).transpose(1, 2).contiguous()


def _row_spans(attention_mask: torch.Tensor) -> tuple[list[int], list[int]]:
    """Each row's first and last real column of SDPA's ``(B, 1, q, L)`` mask (bool: True = attend;
    additive: 0 = attend). Columns past the mask (a growing cache's spare ones) are never real."""
    global _spans
    seen = _spans
    if seen is not None and seen[0] is attention_mask:
        return seen[1], seen[2]
    mask = attention_mask[:, 0, -1]
    real = mask if mask.dtype == torch.bool else mask == 0
    columns = torch.arange(real.shape[-1], device=real.device)
    first = torch.where(real, columns, real.shape[-1]).amin(dim=-1).tolist()
    last = torch.where(real, columns, -1).amax(dim=-1).tolist()
    _spans = (attention_mask, first, last)
    return first, last


def _rows_exactly(probs: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``probs @ v`` with each row's numbers independent of its company (batch_invariant_greedy).

    Why not the plain batched product: a bf16 ``probs @ v`` gives a row other last bits when its columns sit
    at another offset of the summed dimension, or when that dimension is much longer (measured on an AMD
    EPYC: 2-26 of 172,800 outputs differed for left offsets from 1 to 565, 3 for 300 trailing zero columns,
    none for up to 128; through 30 layers a greedy token flipped). In a batch, rows are left-padded to the
    longest one, so a row's offset and the summed length depend on its company.

    So each row's product runs over a window that depends on the row alone: the ``2^k >= span`` columns
    (at least 64) ending at its last real column, zeros (masked probabilities) before its first. Rows with
    the same window width and end share one product; in a stream of similar prompts that is one or two
    products per layer. The rest is exact per row and stays batched: ``q @ k^T`` sums over the head dimension
    only, and the float32 softmax over a row padded with ``-inf`` gave the same bits at every offset (1.28M
    of 1.28M outputs).
    """
    first, last = _row_spans(attention_mask)
    groups: dict[tuple[int, int], list[int]] = {}
    for row, (start, end) in enumerate(zip(first, last, strict=True)):
        span = max(end - start + 1, 1)
        groups.setdefault((max(64, 1 << (span - 1).bit_length()), end + 1), []).append(row)
    if len(groups) == 1:
        ((width, end), _), = groups.items()
        return _window_product(probs, value, width, end)
    out = probs.new_empty((*probs.shape[:-1], value.shape[-1]))
    for (width, end), rows in groups.items():
        index = torch.tensor(rows, dtype=torch.long, device=probs.device)
        out[index] = _window_product(probs[index], value[index], width, end)
    return out


def _window_product(probs: torch.Tensor, value: torch.Tensor, width: int, end: int) -> torch.Tensor:
    """``probs[..., end - width:end] @ value[:, :, end - width:end]``, zero columns in front where the buffers
    start later than ``end - width``."""
    missing = width - end
    if missing <= 0:
        return torch.matmul(probs[..., end - width:end], value[:, :, end - width:end])
    probs = torch.nn.functional.pad(probs[..., :end], (missing, 0))
    value = torch.nn.functional.pad(value[:, :, :end], (0, 0, missing, 0))
    return torch.matmul(probs, value)


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
    """Switch a loaded transformers model from ``sdpa`` to this function; whether the model now runs it (True
    too when an earlier generator switched it already; False, unchanged, for any other implementation, which
    the model's config chose on purpose)."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation == NAME:
        return True
    if implementation != "sdpa":
        return False
    _register()
    model.set_attn_implementation(NAME)
    return True


def exact_rows(model: Any) -> int:
    """Make every attention module of ``model`` compute a decode step's ``probs @ v`` over windows that depend
    on each row alone (:func:`_rows_exactly`): a row's numbers then do not depend on its company's padding.
    Rows with the same window share one product. Returns how many modules were switched."""
    switched = 0
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "o_proj"):
            setattr(module, EXACT_ROWS, True)
            switched += 1
    return switched
