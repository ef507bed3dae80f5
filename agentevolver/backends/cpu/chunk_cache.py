"""Keys/values of prompt chunks at fixed boundaries, for greedy requests whose bits must not depend on timing.

Why: ``batch_invariant_greedy`` prefills each greedy request alone, so that nothing another request did can
change its numbers. Prefilling every prompt whole throws away what the shared-prefix and turn caches save:
calc's validation prompts all open with the same system prompt and demonstrations, and each turn repeats
the conversation so far. Those caches decide what to reuse by what else is in the batch (the batch's
common prefix) or what the memory budget kept, and reused keys/values are not the bits a fresh prefill
would compute, so a greedy token could again depend on timing.

Here a prompt is prefilled in chunks of ``chunk_tokens`` at fixed positions (0, C, 2C, ...), each chunk
attending to the chunks before it. A chunk's keys/values then depend only on the tokens up to its end, and
computing them again gives the same bits, since the same operations run on the same inputs. So they can be
kept, keyed by those tokens, and reused by any later prompt that starts with them: a hit and a miss give the
same numbers, and eviction only costs time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["ChunkCache", "Layers"]

#: One chunk's keys and values per layer, each ``[kv_heads, chunk_tokens, head_dim]``.
Layers = list[tuple[torch.Tensor, torch.Tensor]]


class ChunkCache:
    """LRU, bounded in bytes, of chunks' keys/values keyed by every token up to the chunk's end."""

    def __init__(self, *, chunk_tokens: int = 64, max_bytes: int = 512 * 2**20) -> None:
        if chunk_tokens < 1 or max_bytes < 0:
            raise ValueError(f"chunk_tokens must be >= 1 and max_bytes >= 0; got {chunk_tokens}, {max_bytes}")
        self.chunk_tokens = chunk_tokens
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], Layers] = OrderedDict()
        self._bytes = 0
        self.stats = {"hits": 0, "stored": 0, "evicted": 0}

    def clear(self) -> None:
        """Forget every chunk (after a weight update they belong to the old weights)."""
        self._entries.clear()
        self._bytes = 0

    def get(self, tokens: Sequence[int]) -> Layers | None:
        """The chunk ending at ``len(tokens)`` whose keys/values were computed after exactly ``tokens``, or None."""
        key = tuple(tokens)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.stats["hits"] += 1
        return entry

    def store(self, tokens: Sequence[int], layers: Layers) -> None:
        """Keep the chunk ending at ``len(tokens)`` (a multiple of ``chunk_tokens``), evicting the least
        recently used chunks to stay within ``max_bytes``."""
        key = tuple(tokens)
        size = _nbytes(layers)
        if key in self._entries or size > self.max_bytes:
            return
        while self._entries and self._bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= _nbytes(evicted)
            self.stats["evicted"] += 1
        self._entries[key] = layers
        self._bytes += size
        self.stats["stored"] += 1


def _nbytes(layers: Layers) -> int:
    """Bytes of one chunk's keys and values."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
