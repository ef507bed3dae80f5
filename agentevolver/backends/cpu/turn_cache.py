"""Turn cache: keep each finished row's keys/values so the next turn of its conversation prefills only what is new.

A multi-turn episode sends the server its whole conversation every turn: turn ``k + 1``'s prompt is turn
``k``'s prompt, the tokens the model just generated, the tool's answer and the next assistant header. The
shared-prefix cache (:mod:`.prefix_cache`) spares the opening that every episode repeats, but everything
after it (the question, earlier answers, tool results) used to be prefilled again on every turn. Measured on
calc's hard levels (SmolLM2-135M, bf16, 2-core Intel Xeon VM), prefill was 57% of the rollout server's busy
time. vLLM's automatic prefix caching spares this on GPUs; this is the CPU generator's version of it.

When a row stops, its keys/values after the batch's shared prefix are copied out (only the real columns,
not padding) and kept under the token ids they were computed from (prompt + generated tokens but the last,
which was sampled, never fed). A later request whose prompt extends those ids takes the entry: its batch
lays the row out as ``[shared prefix | padding | cached part | padding | new tokens]``, with the mask hiding
padding and position ids counting real tokens, so each row computes what it would alone, up to
floating-point summation order. Causal attention makes a prefix's keys/values independent of what follows,
so this is the same computation, not an approximation.

An entry is taken (removed) by the request that uses it; that request's own row leaves a longer entry for
the turn after. Entries of episodes that ended are dropped oldest first once the cache holds more than
``max_bytes``. A weight update clears the cache: the kept keys/values belong to the old weights.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["TurnCache", "TurnEntry"]


@dataclass(slots=True)
class TurnEntry:
    """One finished row: the ids it was computed from and, per layer, the keys/values after ``prefix_len``."""

    token_ids: tuple[int, ...]
    prefix_len: int  # the batch's shared-prefix length when it ran; its keys/values are not kept here
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # (kv_heads, len(token_ids) - prefix_len, head_dim) each
    nbytes: int

    @property
    def cached_len(self) -> int:
        """Tokens this entry holds keys/values for, after the shared prefix."""
        return len(self.token_ids) - self.prefix_len


class TurnCache:
    """LRU of finished rows' keys/values, bounded by bytes; see the module docstring.

    Args:
        max_bytes: most bytes of keys/values kept; 0 turns the cache off.
        min_tokens: a row that would reuse fewer tokens than this is not worth its copy and is not kept.
    """

    def __init__(self, *, max_bytes: int, min_tokens: int = 16) -> None:
        if max_bytes < 0 or min_tokens < 1:
            raise ValueError(f"max_bytes must be >= 0 and min_tokens >= 1; got {max_bytes}, {min_tokens}")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: OrderedDict[tuple[int, ...], TurnEntry] = OrderedDict()
        self.nbytes = 0
        self.stats = {"stored": 0, "hits": 0, "taken_tokens": 0, "evicted": 0}

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (after a weight update the kept keys/values are stale)."""
        self._entries.clear()
        self.nbytes = 0

    def take(self, prompt: Sequence[int], prefix_len: int) -> TurnEntry | None:
        """Remove and return the longest entry that ``prompt`` extends and that ran with the same shared
        prefix, or None. The prompt keeps at least one token beyond the entry (the model must see a new token
        to give the next-token logits)."""
        if not self._entries:
            return None
        best: TurnEntry | None = None
        for key, entry in self._entries.items():
            if entry.prefix_len != prefix_len or len(key) >= len(prompt):
                continue
            if (best is None or len(key) > len(best.token_ids)) and tuple(prompt[: len(key)]) == key:
                best = entry
        if best is None:
            return None
        del self._entries[best.token_ids]
        self.nbytes -= best.nbytes
        self.stats["hits"] += 1
        self.stats["taken_tokens"] += best.cached_len
        return best

    def store(self, token_ids: Sequence[int], prefix_len: int,
              layers: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Keep ``layers`` (keys/values of ``token_ids[prefix_len:]``, already copied out of the batch).

        Returns False (nothing kept) when the cache is off, the part is shorter than ``min_tokens`` or larger
        than the whole budget. Older entries are dropped until the budget holds.
        """
        cached = len(token_ids) - prefix_len
        if not self.enabled or cached < self.min_tokens:
            return False
        nbytes = sum(k.nbytes + v.nbytes for k, v in layers)
        if nbytes > self.max_bytes:
            return False
        key = tuple(int(t) for t in token_ids)
        old = self._entries.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._entries[key] = TurnEntry(key, prefix_len, layers, nbytes)
        self.nbytes += nbytes
        self.stats["stored"] += 1
        while self.nbytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.nbytes -= dropped.nbytes
            self.stats["evicted"] += 1
        return True
