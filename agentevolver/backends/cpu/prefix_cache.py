"""Shared-prefix KV cache: compute the attention keys/values of a prompt prefix once, reuse it per batch.

Agent prompts share long prefixes: every episode of an environment starts with the same system prompt
(and, for ``calc``, the same worked demonstrations), so a batch of first turns repeats the same ~1.5k tokens
in every row. On a CPU, prefill of those tokens dominates rollout time. vLLM's automatic prefix caching
solves this on GPUs; this is the small CPU version: a batch's common prefix (rounded down to
``block_tokens`` so that batches with slightly different common prefixes share one entry) is prefilled
once with batch size 1, kept in a small LRU, and repeated across the batch's rows. Causal attention makes
a prefix's keys/values independent of what follows, so the result is the same computation, not an
approximation (up to floating-point summation order).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["PrefixCache", "common_prefix_length"]


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by all ``prompts``."""
    first = prompts[0]
    limit = min(len(p) for p in prompts)
    for index in range(limit):
        token = first[index]
        if any(p[index] != token for p in prompts[1:]):
            return index
    return limit


class PrefixCache:
    """LRU of prefilled prefixes (batch size 1), keyed by their token ids."""

    def __init__(self, *, block_tokens: int = 64, min_tokens: int = 128, max_entries: int = 4) -> None:
        if block_tokens < 1 or min_tokens < 1 or max_entries < 0:
            raise ValueError("block_tokens and min_tokens must be >= 1, max_entries >= 0")
        self.block_tokens = block_tokens
        self.min_tokens = min_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.stats = {"hits": 0, "misses": 0, "reused_tokens": 0}

    def clear(self) -> None:
        """Forget every entry (after a weight update the cached keys/values are stale)."""
        self._entries.clear()

    def lookup(self, prompts: Sequence[Sequence[int]], model: Any) -> tuple[int, Any] | None:
        """``(prefix_length, cache expanded to the batch)`` for ``prompts``, or None when no prefix applies.

        Every row keeps at least one token outside the prefix (the model must see one new token to produce
        the next-token logits).
        """
        if self.max_entries == 0:
            return None
        usable = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        best: tuple[int, ...] | None = None
        for key in self._entries:
            if len(key) <= usable and (best is None or len(key) > len(best)) and \
                    tuple(prompts[0][: len(key)]) == key:
                best = key
        if best is None:
            length = usable // self.block_tokens * self.block_tokens
            if length < self.min_tokens or len(prompts) < 2:
                return None
            best = tuple(prompts[0][:length])
            self._entries[best] = self._prefill(best, model)
            self.stats["misses"] += 1
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(best)
            self.stats["hits"] += 1
        self.stats["reused_tokens"] += len(best) * len(prompts)
        return len(best), self._expand(self._entries[best], len(prompts), model)

    @staticmethod
    def _prefill(prefix: tuple[int, ...], model: Any) -> Any:
        from transformers import DynamicCache

        device = next(model.parameters()).device
        ids = torch.tensor([prefix], dtype=torch.long, device=device)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
        return cache

    @staticmethod
    def _expand(stored: Any, rows: int, model: Any) -> Any:
        """A fresh cache holding ``stored``'s keys/values repeated ``rows`` times (``stored`` stays intact).

        A growing layer's rows are written once, straight into buffers with spare columns for the prompts'
        remaining tokens (:meth:`.GrowingLayer.from_columns`), not copied contiguous and then copied again by
        its first append."""
        from agentevolver.backends.cpu.kv_cache import GrowingLayer, new_cache

        cache = new_cache(model.config)
        for index, layer in enumerate(stored.layers):
            keys, values = layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)
            target = cache.layers[index]
            if isinstance(target, GrowingLayer):
                cache.layers[index] = GrowingLayer.from_columns([(keys, values)], keys.shape[-2],
                                                                keys_transposed=target.keys_transposed)
            else:
                cache.update(keys.contiguous(), values.contiguous(), index)
        return cache
