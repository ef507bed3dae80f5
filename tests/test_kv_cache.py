"""The growing KV cache (agentevolver/backends/cpu/kv_cache.py) against transformers' DynamicCache.

Oracle: the same model decoding the same rows with ``DynamicCache`` (its ``torch.cat`` append). Real
``tiny-test`` weights, in fp32 (SDPA, plain layout) and bf16 (the decode attention, transposed keys and whole
buffers).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from agentevolver.backends.cpu import decode_attention
from agentevolver.backends.cpu.kv_cache import HEADROOM, GrowingLayer, new_cache
from agentevolver.models import resolve_model_path


def load(dtype: torch.dtype) -> Any:
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=dtype,
                                                 attn_implementation="sdpa").eval()
    if dtype == torch.bfloat16:
        assert decode_attention.install(model)
    return model


def decode(model: Any, cache: Any, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy-decode 3 left-padded rows for ``steps`` steps; the tokens and each step's logits."""
    torch.manual_seed(0)
    lengths = [9, 4, 7]
    width = max(lengths)
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(3, 200, (length,))
        mask[row, width - length:] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens: list[list[int]] = [[], [], []]
    logits_seen = []
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1]
        positions = positions[:, -1:]
        for _ in range(steps):
            logits_seen.append(logits.float())
            chosen = logits.argmax(-1)
            for row, token in enumerate(chosen.tolist()):
                tokens[row].append(token)
            mask = torch.cat([mask, mask.new_ones((3, 1))], dim=-1)
            positions = positions + 1
            logits = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=positions,
                           past_key_values=cache, use_cache=True).logits[:, -1]
    return tokens, logits_seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_growing_cache_decodes_what_dynamic_cache_decodes(dtype: torch.dtype) -> None:
    model = load(dtype)
    steps = HEADROOM + 12  # crosses one buffer growth
    want_tokens, want_logits = decode(model, DynamicCache(config=model.config), steps)
    cache = new_cache(model.config)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.layers[0].keys_transposed == (dtype == torch.bfloat16)
    got_tokens, got_logits = decode(model, cache, steps)
    assert got_tokens == want_tokens
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for got, want in zip(got_logits, want_logits, strict=True):
        assert torch.allclose(got, want, atol=tolerance, rtol=0)
    assert cache.get_seq_length() == 9 + steps


def test_appends_write_in_place_until_the_headroom_is_used() -> None:
    layer = GrowingLayer()
    first = torch.randn(2, 3, 5, 4)
    layer.update(first, first + 1)
    buffer = layer._key_buffer
    assert buffer is not None and buffer.shape[2] == 5 + HEADROOM
    for step in range(HEADROOM):
        column = torch.full((2, 3, 1, 4), float(step))
        keys, _ = layer.update(column, column)
        assert layer._key_buffer is buffer  # no copy while there is room
        assert keys.shape[2] == 6 + step
    torch.testing.assert_close(layer.keys[:, :, :5], first)
    torch.testing.assert_close(layer.values[:, :, -1:], torch.full((2, 3, 1, 4), float(HEADROOM - 1)))
    layer.update(torch.zeros(2, 3, 1, 4), torch.zeros(2, 3, 1, 4))
    assert layer._key_buffer is not buffer  # full: a new buffer, the old columns carried over
    torch.testing.assert_close(layer.keys[:, :, :5], first)


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_rows_leaving_select_the_buffers_so_the_next_append_writes_in_place(transposed: bool) -> None:
    """``batch_select_indices`` (a row left the batch) selects the buffers' rows, spare columns included: the
    next decode step appends into that buffer instead of copying the cache once more."""
    layer = GrowingLayer(keys_transposed=transposed)
    states = torch.randn(3, 2, 6, 4)
    layer.update(states, states + 1)
    layer.batch_select_indices(torch.tensor([2, 0]))
    buffer = layer._key_buffer
    assert buffer is not None and buffer.shape[0] == 2
    torch.testing.assert_close(layer.keys, states[[2, 0]])
    new = torch.randn(2, 2, 1, 4)
    keys, values = layer.update(new, new)
    assert layer._key_buffer is buffer  # appended in place
    torch.testing.assert_close(layer.keys, torch.cat([states[[2, 0]], new], dim=2))
    torch.testing.assert_close(layer.values, torch.cat([states[[2, 0]] + 1, new], dim=2))
    if transposed:  # a decode step of the transposed layout gets whole buffers: spare columns are zeros
        assert bool((keys[:, :, 7:] == 0).all()) and bool((values[:, :, 7:] == 0).all())


def test_replaced_keys_start_a_fresh_buffer() -> None:
    """Columns dropped by a slice replace ``keys``; the next append must not write into the old buffer behind
    them."""
    layer = GrowingLayer(keys_transposed=True)
    states = torch.randn(3, 2, 6, 4)
    layer.update(states, states)
    buffer = layer._key_buffer
    layer.keys, layer.values = layer.keys[:, :, 2:], layer.values[:, :, 2:]
    new = torch.randn(3, 2, 1, 4)
    keys, values = layer.update(new, new)
    assert layer._key_buffer is not buffer
    # a decode step of the transposed layout returns whole buffers; the real columns come first
    torch.testing.assert_close(keys[:, :, :4], states[:, :, 2:])
    torch.testing.assert_close(keys[:, :, 4:5], new)
    assert bool((keys[:, :, 5:] == 0).all()) and bool((values[:, :, 5:] == 0).all())
    torch.testing.assert_close(layer.keys, torch.cat([states[:, :, 2:], new], dim=2))


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_from_columns_stacks_rows_right_aligned_behind_zero_padding(transposed: bool) -> None:
    """Rows joining a running batch (``running_batch.merge_all``): each part right-aligned in the width, zeros
    to its left and in the spare columns, one buffer the next step appends into; a part that is another growing
    layer's view (its buffer's layout) reads the same as a plain tensor."""
    running = GrowingLayer(keys_transposed=transposed)
    old = torch.randn(2, 3, 7, 4)
    running.update(old, old * 2)
    joining = torch.randn(1, 3, 4, 4)
    layer = GrowingLayer.from_columns([(running.keys, running.values), (joining, joining * 2)], 7,
                                      keys_transposed=transposed)
    assert layer.get_seq_length() == 7 and layer.keys.shape == (3, 3, 7, 4)
    want = torch.cat([old, torch.cat([torch.zeros(1, 3, 3, 4), joining], dim=2)])
    torch.testing.assert_close(layer.keys, want)
    torch.testing.assert_close(layer.values, want * 2)
    buffer = layer._key_buffer
    new = torch.randn(3, 3, 1, 4)
    layer.update(new, new)
    assert layer._key_buffer is buffer  # spare columns ready: appended in place
    torch.testing.assert_close(layer.keys, torch.cat([want, new], dim=2))
    assert bool((layer._value_buffer[:, :, 8:] == 0).all())


def test_a_speculative_block_gets_the_whole_buffers_and_a_prefill_a_copy() -> None:
    """Inside ``draft_blocks`` a block of a few tokens takes the decode attention, so it gets the buffers
    themselves, as a one-token step does: a contiguous copy of every layer's cache per pass cost a speculative
    step more than its attention (SmolLM2, 16 rows of ~900 tokens, bf16: 308 -> 237 ms a pass). Outside it
    (a prefill, SDPA) the same block gets plain tensors of the exact width."""
    layer = GrowingLayer(keys_transposed=True)
    states = torch.randn(2, 3, 6, 4)
    layer.update(states, states)
    block = torch.randn(2, 3, 4, 4)
    with decode_attention.draft_blocks():
        keys, values = layer.update(block, block)
    assert keys.data_ptr() == layer._key_buffer.data_ptr() and values.data_ptr() == layer._value_buffer.data_ptr()
    assert keys.shape[2] == 6 + HEADROOM
    torch.testing.assert_close(keys[:, :, :10], torch.cat([states, block], dim=2))
    assert bool((keys[:, :, 10:] == 0).all())
    keys, values = layer.update(block, block)  # the same block outside: SDPA's prefill wants exact, contiguous
    assert keys.shape[2] == 14 and keys.is_contiguous() and values.is_contiguous()
    assert keys.data_ptr() != layer._key_buffer.data_ptr()
    too_long = torch.randn(2, 3, decode_attention.MAX_QUERIES + 1, 4)
    with decode_attention.draft_blocks():
        keys, _ = layer.update(too_long, too_long)  # past MAX_QUERIES the block goes to SDPA, so: exact width
    assert keys.shape[2] == 14 + decode_attention.MAX_QUERIES + 1


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_rows_join_free_slots_without_copying_the_running_rows(transposed: bool) -> None:
    """``join`` writes only the joiners, right-aligned, into the buffer's free slots (no new buffer, the running
    rows untouched); ``has_room`` refuses a joiner wider than the batch or more rows than the free slots."""
    running = torch.randn(2, 3, 5, 4)
    layer = GrowingLayer.from_columns([(running, running + 1)], 5, keys_transposed=transposed, row_capacity=4)
    buffer = layer._key_buffer
    assert layer.has_room(2, 5) and not layer.has_room(3, 5) and not layer.has_room(1, 6)
    joiner = torch.randn(1, 3, 3, 4)
    layer.join([(joiner, joiner + 1)])
    assert layer._key_buffer is buffer and layer.keys.shape == (3, 3, 5, 4)
    want = torch.cat([running, torch.cat([torch.zeros(1, 3, 2, 4), joiner], dim=2)])
    torch.testing.assert_close(layer.keys, want)
    torch.testing.assert_close(layer.values[:2], running + 1)
    with pytest.raises(ValueError, match="no room"):
        layer.join([(torch.randn(1, 3, 6, 4),) * 2])
    new = torch.randn(3, 3, 1, 4)
    layer.update(new, new)
    assert layer._key_buffer is buffer
    torch.testing.assert_close(layer.keys, torch.cat([want, new], dim=2))


@pytest.mark.parametrize("transposed", [False, True], ids=["plain", "transposed"])
def test_a_leavers_slot_takes_the_last_row_in_place(transposed: bool) -> None:
    """Rows 0 and 2 of 4 leave: ``fill_from_end`` keeps row 1 and moves row 3 into slot 0; the buffer moves
    that one row in place, and a row joining the freed slots reads zeros past its columns."""
    from agentevolver.backends.cpu.running_batch import fill_from_end

    order = fill_from_end([1, 3], 4)
    assert order == [3, 1]
    states = torch.randn(4, 2, 6, 4)
    layer = GrowingLayer.from_columns([(states, states * 3)], 6, keys_transposed=transposed, row_capacity=4)
    buffer = layer._key_buffer
    layer.batch_select_indices(torch.tensor(order))
    assert layer._key_buffer is buffer
    torch.testing.assert_close(layer.keys, states[order])
    torch.testing.assert_close(layer.values, states[order] * 3)
    layer.join([(states[:1, :, :4], states[:1, :, :4])])
    assert bool((layer.keys[2, :, :2] == 0).all())
    with pytest.raises(ValueError, match="distinct rows"):
        fill_from_end([1, 1], 4)
    assert fill_from_end([0, 1, 2], 4) == [0, 1, 2]  # the last row left: nothing moves
    assert fill_from_end([3, 2], 4) == [2, 3]  # slots 0 and 1 freed: the kept rows move there in row order
