"""The rows a CPU decode loop advances together, and how rows prefilled at different times become one batch.

Why its own module: with continuous batching, requests join a batch that is already decoding, so two
batches built at different times (different widths, different shared prefixes, different turn-cache
layouts) must become one. Every row's layout rule makes that a matter of padding alone: a row is its real
key/value columns in token order, hidden padding wherever the batch needed it, and position ids that count
real tokens only. So a batch can be left-padded to any width, and rows of any two batches can be stacked,
without changing what any row computes (up to floating-point effects of the batch's shape).

This module holds that state and the tensor work on it; the generator (:mod:`.generator`) owns the model,
the caches and the request queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentevolver.backends.cpu.sampling import RowSampler

__all__ = ["Row", "RunningBatch", "fill_from_end", "merge", "merge_all"]


@dataclass(slots=True)
class Row:
    """One request in a running batch: what it asked for, what it produced so far, and its cache's prefix."""

    request: Any  # the generator's request (prompt_ids, settings, future, constraint)
    output: Any  # the generator's output under construction (token_ids, log_probs, stop_ids, stop_reason)
    prefix_len: int  # the shared-prefix length its keys/values were computed with (the turn cache's key)
    lookup: Any = None  # its prompt-lookup drafter (speculative decoding), made at its first draft
    exclude: int | None = None  # a drafted token its next sample must not be (rejected by the last check)


@dataclass(slots=True)
class RunningBatch:
    """Rows with their keys/values, ready to sample: ``logits`` holds every row's next-token logits.

    ``mask`` is ``[rows, columns]`` (1 = a real token of that row), the cache has the same columns, and
    ``positions`` is ``[rows, 1]``, each row's position id of the last token it was fed.
    """

    rows: list[Row]
    cache: Any  # transformers.DynamicCache
    mask: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor
    sampler: RowSampler

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """Columns of keys/values (real or padding) each row attends over."""
        return int(self.mask.shape[1])

    def select(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (indices into the current rows), in that order."""
        index = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.sampler.select(index)
        self.mask, self.positions, self.logits = self.mask[index], self.positions[index], self.logits[index]
        self.rows = [self.rows[i] for i in keep]

    def drop(self, keep: list[int]) -> list[int]:
        """Keep only the rows at ``keep``, moving as few as possible: a leaving row's slot takes a kept row from
        the end, so the cache copies one row per leaver (:meth:`.GrowingLayer.batch_select_indices`), not every
        row behind it. Returns the kept rows' former indices in their new order, to index other per-row data."""
        order = fill_from_end(keep, len(self))
        self.select(order)
        return order

    def dead_columns(self) -> int:
        """Leading columns that no row attends to (left by rows that have left).

        A merge leaves them out (:func:`merge_all`), where the batch's shape changes anyway, so a long stream's
        width follows its live rows, not every row it has served; a batch nobody joins keeps them, so it
        computes exactly what it did before continuous batching (its attention widths unchanged).
        """
        used = self.mask.any(dim=0)
        return int(used.to(torch.int8).argmax()) if bool(used.any()) else 0


def _left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``tensor`` with zero columns prepended along ``dim`` up to ``width``."""
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def fill_from_end(keep: Sequence[int], rows: int) -> list[int]:
    """The order :meth:`RunningBatch.drop` keeps ``keep`` in (of ``rows`` rows): kept rows among the first
    ``len(keep)`` stay in their slots, and the others fill the leavers' slots there."""
    kept = set(keep)
    if len(kept) != len(keep) or not all(0 <= row < rows for row in kept):
        raise ValueError(f"keep must name distinct rows of 0..{rows - 1}; got {list(keep)}")
    count = len(keep)
    movers = iter(sorted(row for row in kept if row >= count))
    return [slot if slot in kept else next(movers) for slot in range(count)]


def merge(running: RunningBatch, joining: RunningBatch, model_config: Any) -> RunningBatch:
    """One batch holding ``running``'s rows, then ``joining``'s; both must be ready to sample (:func:`merge_all`)."""
    return merge_all([running, joining], model_config)


def merge_all(batches: Sequence[RunningBatch], model_config: Any, *, row_capacity: int = 0) -> RunningBatch:
    """One batch holding every row of ``batches``, in order; each must be ready to sample.

    Where the first batch's cache has free row slots for the others, is at least as wide as each of them and
    has few leading columns that no row attends to (at most :data:`.kv_cache.HEADROOM`), the others' rows are
    written into those slots, right-aligned (:meth:`.GrowingLayer.join`), and its rows are not copied: a
    running batch that requests join. Otherwise a fresh cache with slots for ``row_capacity`` rows: leading
    columns no row of a batch attends to are left out, and narrower batches are left-padded (masked columns)
    to the widest one's width, each row's columns written once (:meth:`.GrowingLayer.from_columns`). Either
    way each row's real columns, positions and sampler state are unchanged, so each row goes on computing what
    it computed alone. All at once, so that rows prefilled one by one (batch_invariant_greedy) are copied into
    the batch once, not once per row that follows them.
    """
    from agentevolver.backends.cpu.kv_cache import HEADROOM, GrowingLayer, new_cache  # imports transformers

    if len(batches) == 1:
        return batches[0]
    first, others = batches[0], batches[1:]
    rows = sum(len(batch) for batch in others)
    dead = [batch.dead_columns() for batch in batches]
    if dead[0] <= HEADROOM and all(
            isinstance(layer, GrowingLayer) and layer.has_room(rows, max(batch.width for batch in others))
            for layer in first.cache.layers):
        for index, layer in enumerate(first.cache.layers):
            layer.join([(batch.cache.layers[index].keys, batch.cache.layers[index].values) for batch in others])
        return _stacked(batches, first.cache, first.width, [0] * len(batches))
    width = max(batch.width - skip for batch, skip in zip(batches, dead, strict=True))
    cache = new_cache(model_config)
    for index, layers in enumerate(zip(*(batch.cache.layers for batch in batches), strict=True)):
        parts = [(layer.keys[:, :, skip:], layer.values[:, :, skip:]) for layer, skip in zip(layers, dead, strict=True)]
        if isinstance(cache.layers[index], GrowingLayer):
            cache.layers[index] = GrowingLayer.from_columns(parts, width, row_capacity=row_capacity,
                                                            keys_transposed=cache.layers[index].keys_transposed)
            continue
        keys = torch.cat([_left_pad(keys, width, 2) for keys, _ in parts])
        values = torch.cat([_left_pad(values, width, 2) for _, values in parts])
        cache.update(keys, values, index)
    return _stacked(batches, cache, width, dead)


def _stacked(batches: Sequence[RunningBatch], cache: Any, width: int, dead: Sequence[int]) -> RunningBatch:
    """The batch of ``batches``' rows over ``cache``: each mask without its ``dead`` leading columns, left-padded
    to ``width``; the first batch's sampler takes the others' rows."""
    first = batches[0]
    for batch in batches[1:]:
        first.sampler.extend(batch.sampler)
    return RunningBatch(
        rows=[row for batch in batches for row in batch.rows],
        cache=cache,
        mask=torch.cat([_left_pad(batch.mask[:, skip:], width, 1) for batch, skip in zip(batches, dead, strict=True)]),
        positions=torch.cat([batch.positions for batch in batches]),
        logits=torch.cat([batch.logits.to(first.logits.dtype) for batch in batches]),
        sampler=first.sampler,
    )
