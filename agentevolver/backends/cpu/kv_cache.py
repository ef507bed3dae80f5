"""A KV cache whose layers append in place, for the CPU generator's decode loop.

Why: transformers' ``DynamicLayer`` appends a decode step's key/value column with ``torch.cat``, which copies
the whole cache of every layer on every step. Measured on a 2-core AMD EPYC (SmolLM2-135M, bf16, 16 rows
over 500-token prompts), that copy was a third of a decode step: ``aten::cat`` 36 ms of 106 ms, as much as
all the model's matrix products. :class:`GrowingLayer` keeps its keys and values as views into a buffer with
spare columns and writes each new column into it; the copy happens only when the spare columns run out
(every :data:`HEADROOM` steps) or when the batch's rows change: a row leaving selects the buffers' rows
(:meth:`GrowingLayer.batch_select_indices`), and rows joining are copied once into a fresh buffer
(:meth:`GrowingLayer.from_columns`), each keeping its spare columns and layout.

Everything else about the layer is transformers' own: ``keys``/``values`` are ordinary tensors of shape
``[rows, kv_heads, columns, head_dim]`` (views, contiguous in their last two dimensions), so attention
reads them as before, and any code that replaces them (``crop``, a slice) just makes the next append start a
fresh buffer.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentevolver.backends.cpu import decode_attention

__all__ = ["HEADROOM", "GrowingLayer", "new_cache"]

#: Spare columns a buffer is allocated with: one copy of the cache per this many decode steps.
HEADROOM = 128


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` with keys/values as views into buffers that have room for :data:`HEADROOM` more columns.

    Args:
        keys_transposed: for the bf16/fp16 decode attention (:mod:`.decode_attention`): keep the key buffer as
            ``[rows, heads, head_dim, columns]`` and give a decode step the *whole* buffers, spare columns
            included (zeros, hidden by the mask, which that attention pads to the buffer's width); so too a
            speculative step's block of drafted tokens (:func:`.decode_attention.takes_block`). A bf16
            GEMM on CPU copies a strided operand to a contiguous one first: with views of the first columns
            the two copies per layer cost as much as ``torch.cat`` did. Whole buffers are contiguous, so
            nothing is copied, for at most :data:`HEADROOM` extra columns of attention. fp32 GEMMs read
            strided views at full speed, and SDPA (fp32 decode steps) wants exact widths: plain layout.
    """

    def __init__(self, keys_transposed: bool = False) -> None:
        super().__init__()
        self.keys_transposed = keys_transposed
        # [capacity rows, ...]: the first ``_rows`` are the batch's; the rest are free slots for rows that join
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._rows = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.append(key_states, value_states)
        key_buffer, value_buffer = self._buffers()
        if not (self.keys_transposed and decode_attention.takes_block(key_states.shape[-2])):
            # a prefill (SDPA), or SDPA's fp32 decode step: plain tensors of the exact width, contiguous for a prefill
            if key_states.shape[-2] > 1:
                return self.keys.contiguous(), self.values.contiguous()
            return self.keys, self.values
        # the decode attention, one token or a speculative step's block: the whole buffers, spare columns masked
        return key_buffer.transpose(-1, -2), value_buffer

    def append(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Write columns after the cached ones (in place while the spare columns last), returning nothing: for
        callers that only store (a turn cache's taken section), where ``update``'s contiguous copies for a
        multi-token prefill would be thrown away."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._backed(end, key_states):
            self._rebuffer(length, end, key_states)
        key_buffer, value_buffer = self._buffers()
        if self.keys_transposed:
            key_buffer[..., length:end] = key_states.transpose(-1, -2)
        else:
            key_buffer[:, :, length:end] = key_states
        value_buffer[:, :, length:end] = value_states
        self.keys, self.values = self._views(end)

    @classmethod
    def from_columns(cls, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int, *,
                     keys_transposed: bool, row_capacity: int = 0) -> GrowingLayer:
        """A layer holding the rows of ``parts`` (``(keys, values)``, each ``[rows, heads, columns, head_dim]``)
        stacked in order, each right-aligned in ``width`` columns behind zero (masked) padding, with free row
        slots up to ``row_capacity`` for rows that join later (:meth:`join`).

        Why: rows that join a running batch were left-padded with ``torch.cat``, stacked with another, and copied
        into a fresh buffer by the first append (transposing the keys on the way): three copies of the whole
        cache and a slow strided one, each join. Here each part's columns are written once into buffers that
        already have the spare columns; a part that is a growing layer's view reads from its buffer's layout.
        """
        keys0, values0 = parts[0]
        rows = sum(keys.shape[0] for keys, _ in parts)
        heads, dim = keys0.shape[1], keys0.shape[-1]
        capacity, columns = max(rows, row_capacity), width + HEADROOM
        layer = cls(keys_transposed=keys_transposed)
        layer.lazy_initialization(keys0, values0)
        layer._key_buffer = keys0.new_empty((capacity, heads, dim, columns) if keys_transposed
                                            else (capacity, heads, columns, dim))
        layer._value_buffer = values0.new_empty((capacity, heads, columns, dim))
        layer._rows = rows
        layer._write_rows(0, parts, width)  # free slots stay unwritten until a row joins (:meth:`join`)
        layer.keys, layer.values = layer._views(width)
        return layer

    def has_room(self, rows: int, width: int) -> bool:
        """Can :meth:`join` add ``rows`` rows of at most ``width`` columns: free slots for them, and a batch at
        least that wide whose views are still the buffers'?"""
        length = self.get_seq_length()
        return (self._key_buffer is not None and 0 < width <= length and self._owns_views()
                and self._rows + rows <= self._key_buffer.shape[0])

    def join(self, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Add the rows of ``parts`` after the batch's, right-aligned in its columns, writing only theirs into
        free row slots (check :meth:`has_room` first).

        Why: a join copied the running rows' whole cache (hundreds of MB for 16 rows of ~1k tokens) to add one
        or two rows, at every join of a continuous batch."""
        length = self.get_seq_length()
        rows = sum(keys.shape[0] for keys, _ in parts)
        if not self.has_room(rows, max(keys.shape[-2] for keys, _ in parts)):
            raise ValueError(f"no room to join {rows} row(s) to this layer (has_room is False)")
        self._write_rows(self._rows, parts, length)
        self._rows += rows
        self.keys, self.values = self._views(length)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows at ``indices``, in that order, within the buffers (spare columns and free slots
        kept, so the next append writes in place): a row copy for each row that moves, none for the others.
        transformers' version indexes the views, and the next append copied that again into a fresh buffer."""
        length = self.get_seq_length()
        order = indices.tolist()
        if not length or not self._owns_views():
            super().batch_select_indices(indices)
            return
        key_columns, value_buffer = self._key_columns(), self._value_buffer
        assert self._key_buffer is not None and value_buffer is not None
        if _copies_in_order(order):
            for slot, source in enumerate(order):
                if slot != source:  # columns past ``length`` are zeros in every slot: nothing to copy there
                    key_columns[slot, :, :length] = key_columns[source, :, :length]
                    value_buffer[slot, :, :length] = value_buffer[source, :, :length]
        else:  # a row would be read after another was copied over it: select into fresh buffers instead
            self._key_buffer = self._key_buffer.index_select(0, indices)
            self._value_buffer = value_buffer.index_select(0, indices)
        self._rows = len(order)
        self.keys, self.values = self._views(length)

    def _write_rows(self, start: int, parts: list[tuple[torch.Tensor, torch.Tensor]], width: int) -> None:
        """Write ``parts``' rows from slot ``start`` on, each right-aligned in columns ``[0, width)``, zeros to
        its left (masked padding: zeros, never garbage, since 0 x NaN is NaN) and in the spare columns."""
        key_columns, value_buffer = self._key_columns(), self._value_buffer
        assert value_buffer is not None
        for keys, values in parts:
            end, pad = start + keys.shape[0], width - keys.shape[-2]
            key_columns[start:end, :, :pad] = 0
            value_buffer[start:end, :, :pad] = 0
            key_columns[start:end, :, pad:width] = keys
            value_buffer[start:end, :, pad:width] = values
            key_columns[start:end, :, width:] = 0
            value_buffer[start:end, :, width:] = 0
            start = end

    def _key_columns(self) -> torch.Tensor:
        """The whole key buffer as ``[slots, heads, columns, head_dim]`` (a view, in either layout)."""
        assert self._key_buffer is not None
        return self._key_buffer.transpose(-1, -2) if self.keys_transposed else self._key_buffer

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers' slots of the batch's rows (contiguous: the first ``_rows``)."""
        assert self._key_buffer is not None and self._value_buffer is not None
        return self._key_buffer[:self._rows], self._value_buffer[:self._rows]

    def _views(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[rows, heads, end, head_dim]`` views of the batch's rows' first ``end`` columns."""
        key_buffer, value_buffer = self._buffers()
        keys = key_buffer[..., :end].transpose(-1, -2) if self.keys_transposed else key_buffer[:, :, :end]
        return keys, value_buffer[:, :, :end]

    def _backed(self, end: int, key_states: torch.Tensor) -> bool:
        """Do ``keys``/``values`` still start the buffers, with the same rows, and is there room up to ``end``?"""
        keys, values = self._key_buffer, self._value_buffer
        if keys is None or values is None or values.shape[2] < end:
            return False
        if self._rows != key_states.shape[0] or values.dtype != key_states.dtype:
            return False
        return self.keys.numel() == 0 or self._owns_views()

    def _owns_views(self) -> bool:
        """Are ``keys``/``values`` still the views of the buffers' first columns (nothing replaced them)?"""
        keys, values = self._key_buffer, self._value_buffer
        if keys is None or values is None or self.keys.shape[0] != self._rows:
            return False
        expected_keys, expected_values = self._views(self.keys.shape[-2])
        return (self.keys.data_ptr() == keys.data_ptr() and self.keys.stride() == expected_keys.stride()
                and self.values.data_ptr() == values.data_ptr() and self.values.stride() == expected_values.stride())

    def _rebuffer(self, length: int, end: int, key_states: torch.Tensor) -> None:
        rows, heads, _, dim = key_states.shape
        capacity = rows if self._key_buffer is None else max(rows, self._key_buffer.shape[0])
        columns = end + HEADROOM
        # zeros: spare columns may be read (and masked) by the decode attention, and 0 x a NaN would spoil it
        key_buffer = key_states.new_zeros((capacity, heads, dim, columns) if self.keys_transposed
                                          else (capacity, heads, columns, dim))
        value_buffer = key_states.new_zeros((capacity, heads, columns, dim))
        if length:
            if self.keys_transposed:
                key_buffer[:rows, ..., :length] = self.keys.transpose(-1, -2)
            else:
                key_buffer[:rows, :, :length] = self.keys
            value_buffer[:rows, :, :length] = self.values
        self._key_buffer, self._value_buffer, self._rows = key_buffer, value_buffer, rows


def _copies_in_order(order: list[int]) -> bool:
    """Can rows move to their slots (``order[slot]`` is the row that ends up in ``slot``) one by one, in slot
    order, without a row being read after another was copied over its slot? (Keeping rows in their order,
    or filling a leaver's slot with a row from the end, can.)"""
    written: set[int] = set()
    for slot, source in enumerate(order):
        if slot != source:
            if source in written:
                return False
            written.add(slot)
    return True


def new_cache(model_config: Any) -> DynamicCache:
    """A ``DynamicCache`` for ``model_config`` whose full-attention layers are :class:`GrowingLayer`.

    Keys are kept transposed when the model runs the bf16/fp16 decode attention (:mod:`.decode_attention`);
    layers of any other kind (sliding-window, quantized) keep transformers' own class.
    """
    transposed = getattr(model_config, "_attn_implementation", None) == decode_attention.NAME
    cache = DynamicCache(config=model_config)
    cache.layers = [GrowingLayer(keys_transposed=transposed) if type(layer) is DynamicLayer else layer
                    for layer in cache.layers]
    return cache
