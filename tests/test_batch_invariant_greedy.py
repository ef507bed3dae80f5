"""Greedy validation that timing cannot change, decoded in batches (issues 43 and 44).

``batch_invariant_greedy`` promises that a greedy request's tokens and log-probs depend on the weights and its
prompt only. These tests hold each piece of how it keeps that promise while batching, in bf16 on the real
tiny-test model:

* matrix products run on 2 rows up to a probed block (:mod:`agentevolver.backends.cpu.row_blocks`): one row is
  computed as two, more rows than the block in blocks;
* the decode attention's ``probs @ v`` runs over a window that depends on the row alone, whatever its
  company's padding;
* prompts are prefilled in chunks at fixed positions, and a reused chunk gives the bits a fresh one gives
  (:mod:`agentevolver.backends.cpu.chunk_cache`);
* the start-up probe, and the generator as a whole: long greedy prompts sharing an opening, arriving
  together with sampled ones, give the bits they give one at a time, and (where the probe passes) share
  decode steps; where it fails, each decodes alone and still gives the same bits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentevolver.backends.cpu import HFGenerator, decode_attention, row_blocks
from agentevolver.backends.cpu.chunk_cache import ChunkCache
from agentevolver.models import resolve_model_path

GREEDY = {"temperature": 0, "logprobs": True, "max_tokens": 12}
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "logprobs": True, "max_tokens": 12}


@pytest.fixture(scope="module")
def bf16_model() -> Any:
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=torch.bfloat16,
                                                attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Prompts that share a 150-token opening (as calc's demonstrations are shared), of different lengths."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    opening = tokenizer.encode("You are a careful assistant. " * 25, add_special_tokens=False)[:150]
    questions = ["What is 2+2?", "Name three colours and say which one you like best.", "Hi",
                 "List the first ten prime numbers, separated by commas, and then their sum.", "ok?"]
    return [opening + tokenizer.encode(question, add_special_tokens=False) for question in questions]


# -- the pieces -------------------------------------------------------------------------------------------------

def test_a_one_row_product_is_computed_as_two() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(1536, 576, bias=True).to(torch.bfloat16)
    rows = torch.randn(8, 1, 1536).to(torch.bfloat16)
    assert row_blocks.install(layer) == 1 and row_blocks.install(layer) == 0  # once
    with torch.no_grad():
        for row in rows:
            alone = layer(row[None])  # [1, 1, 1536]: one row
            assert alone.shape == (1, 1, 576)
            pair = torch.nn.functional.linear(torch.cat([row, row]), layer.weight, layer.bias)[:1]
            assert torch.equal(alone[0], pair)
            assert torch.equal(layer(row[0]), pair[0])  # a 1-D input keeps its shape
        batched = layer(rows)  # many rows: the plain product
        assert torch.equal(batched, torch.nn.functional.linear(rows, layer.weight, layer.bias))


def test_more_rows_than_the_block_are_multiplied_in_blocks() -> None:
    """Rows 0-3, 4-7 and the lone row 8 (as two): each block's product, in the input's shape."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    assert row_blocks.install(layer, block_rows=4) == 1
    x = torch.randn(3, 3, 64).to(torch.bfloat16)  # 9 rows
    flat = x.reshape(9, 64)
    with torch.no_grad():
        expected = torch.cat([torch.nn.functional.linear(flat[:4], layer.weight),
                              torch.nn.functional.linear(flat[4:8], layer.weight),
                              torch.nn.functional.linear(flat[8:].repeat(2, 1), layer.weight)[:1]])
        assert torch.equal(layer(x), expected.reshape(3, 3, 32))
    with pytest.raises(ValueError, match="block_rows must be >= 2"):
        row_blocks.install(layer, block_rows=1)


def test_the_block_probe_finds_where_the_kernel_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe on a product that rounds rows differently from 33 rows on (as AMX-BF16's kernels did on
    SmolLM2's shapes) picks 32; one that differs at every row count but 2 gets no block; the real product
    here gets a block whose row counts it has checked."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Linear(48, 64, bias=False)).to(torch.bfloat16)
    real = torch.nn.functional.linear
    block = row_blocks.probe_block_rows(model)
    assert block is None or block in row_blocks.CANDIDATES

    def switches_at(threshold: int):
        def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            out = real(x, weight, bias)
            return out + out.abs() * 2**-6 if x.shape[0] > threshold else out  # another rounding
        return linear

    monkeypatch.setattr(row_blocks.functional, "linear", switches_at(32))
    assert row_blocks.probe_block_rows(model) == 32
    monkeypatch.setattr(row_blocks.functional, "linear", switches_at(2))
    assert row_blocks.probe_block_rows(model) is None


def test_exact_rows_attention_ignores_the_company_padding() -> None:
    """A decode step's attention for one row: alone (no padding) and as row 2 of 4 with left padding and spare
    columns, at several widths; the same bits with exact_rows."""
    class Attention(torch.nn.Module):  # what exact_rows looks for: an attention module of a decoder layer
        layer_idx = 0
        o_proj = None

    module = Attention().eval()
    assert decode_attention.exact_rows(torch.nn.Sequential(module)) == 1
    torch.manual_seed(0)
    heads, kv_heads, dim = 9, 3, 64
    for length, pad, spare in ((48, 565, 125), (300, 17, 3), (700, 1, 128), (1000, 333, 0)):
        query = torch.randn(1, heads, 1, dim).to(torch.bfloat16)
        key, value = (torch.randn(1, kv_heads, length, dim).to(torch.bfloat16) for _ in range(2))
        alone, _ = decode_attention.decode_attention_forward(
            module, query, key, value, torch.ones(1, 1, 1, length, dtype=torch.bool))
        width = pad + length
        keys, values = (torch.randn(4, kv_heads, width + spare, dim).to(torch.bfloat16) for _ in range(2))
        keys[2, :, pad:width], values[2, :, pad:width] = key[0], value[0]
        mask = torch.zeros(4, 1, 1, width, dtype=torch.bool)
        mask[:, ..., pad:] = True
        queries = torch.randn(4, heads, 1, dim).to(torch.bfloat16)
        queries[2] = query[0]
        company, _ = decode_attention.decode_attention_forward(module, queries, keys, values, mask)
        assert torch.equal(company[2], alone[0]), (length, pad, spare)


def test_chunk_cache_keeps_chunks_by_their_tokens_within_its_budget() -> None:
    cache = ChunkCache(chunk_tokens=4, max_bytes=2 * 2 * 4 * 4 * 2)  # two chunks of one layer, 4x4 bf16 each
    chunk = [(torch.zeros(1, 4, 4, dtype=torch.bfloat16), torch.ones(1, 4, 4, dtype=torch.bfloat16))]
    cache.store([1, 2, 3, 4], chunk)
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], chunk)
    assert cache.get([1, 2, 3, 4]) is chunk and cache.get([9, 2, 3, 4]) is None
    cache.store([5, 5, 5, 5], chunk)  # over budget: the least recently used ([1..8]) goes
    assert cache.get([1, 2, 3, 4, 5, 6, 7, 8]) is None and cache.get([1, 2, 3, 4]) is chunk
    assert cache.stats["evicted"] == 1
    cache.clear()
    assert cache.get([1, 2, 3, 4]) is None
    with pytest.raises(ValueError, match="chunk_tokens"):
        ChunkCache(chunk_tokens=0)


# -- the generator ----------------------------------------------------------------------------------------------

async def _greedy_alone(gen: HFGenerator, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    outputs = [await gen.generate(f"a{i}", prompt_ids=p, sampling_params=GREEDY) for i, p in enumerate(prompts)]
    return [(out.token_ids, out.log_probs) for out in outputs]


async def _greedy_in_company(gen: HFGenerator, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """Every prompt greedy and sampled at once, the greedy ones arriving at staggered times."""
    async def greedy(index: int, prompt: list[int]) -> Any:
        await asyncio.sleep(0.01 * index)
        return await gen.generate(f"g{index}", prompt_ids=prompt, sampling_params=GREEDY)

    sampled = [gen.generate(f"s{i}", prompt_ids=p, sampling_params=SAMPLED) for i, p in enumerate(prompts)]
    outputs = await asyncio.gather(*(greedy(i, p) for i, p in enumerate(prompts)), *sampled)
    return [(out.token_ids, out.log_probs) for out in outputs[:len(prompts)]]


async def test_the_probe_and_its_verdict_on_this_machine(bf16_model: Any) -> None:
    gen = HFGenerator(bf16_model, [2], pad_token_id=0, batch_invariant_greedy=True)
    try:
        assert isinstance(gen.rows_independent, bool)
        assert gen.probe_row_independence(steps=6) == gen.rows_independent  # the same verdict again
        assert len(gen.chunk_cache._entries) == 0 and gen.stats["requests"] == 0  # the probe leaves no trace
    finally:
        await gen.aclose()
    plain = HFGenerator(bf16_model, [2], pad_token_id=0)
    assert plain.rows_independent is None  # no probe without batch_invariant_greedy
    await plain.aclose()


@pytest.mark.parametrize("decoding", ["batched", "alone"])
@pytest.mark.parametrize("continuous", [False, True])
async def test_greedy_bits_do_not_depend_on_company(bf16_model: Any, prompts: list[list[int]], decoding: str,
                                                    continuous: bool) -> None:
    """Greedy prompts one at a time with a cold chunk cache vs all at once with sampled ones: the same tokens
    and log-probs. ``batched``: where the probe passes, the greedy rows share decode steps; ``alone``: the
    fallback (each in a batch of its own), forced."""
    reference = HFGenerator(bf16_model, [2], pad_token_id=0, batch_invariant_greedy=True, chunk_cache_mb=0)
    crowded = HFGenerator(bf16_model, [2], pad_token_id=0, seed=0, batch_wait_s=0.05, batch_invariant_greedy=True,
                          continuous_batching=continuous)
    try:
        if decoding == "alone":
            crowded.rows_independent = False
        elif not crowded.rows_independent:
            pytest.skip("this CPU's kernels change a row's numbers with its company: greedy requests decode alone")
        alone = await _greedy_alone(reference, prompts)
        assert reference.stats["prefix_cached_tokens"] == 0  # every prompt prefilled whole
        together = await _greedy_in_company(crowded, prompts)
        assert together == alone
        assert crowded.stats["prefix_cached_tokens"] > 0  # the shared opening's chunks were reused
        shared_steps = crowded.stats["generated_tokens"] > crowded.stats["decode_steps"] + crowded.stats["rows"]
        assert shared_steps  # sampled rows at least decode together
        # a second pass over the same prompts: every chunk but each prompt's last comes from the cache
        again = await _greedy_in_company(crowded, prompts)
        assert again == alone
    finally:
        await reference.aclose()
        await crowded.aclose()


async def test_joiners_in_free_slots_and_leavers_swapped_keep_the_bits(bf16_model: Any, prompts: list[list[int]],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Continuous batching in bf16 (the decode attention's transposed keys, whole buffers): narrower greedy
    prompts join the running cache's free row slots without copying its rows, and a row that ends early has its
    slot filled by the last row; every row's tokens and log-probs are the bits it gets decoded alone."""
    from test_continuous_batching import StepGate, submit_during

    reference = HFGenerator(bf16_model, [2], pad_token_id=0, batch_invariant_greedy=True, chunk_cache_mb=0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").eval()
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [2], pad_token_id=0, batch_wait_s=0, batch_invariant_greedy=True,
                      continuous_batching=True)
    lengths = {3: 24, 1: 20, 0: 6, 4: 10, 2: 8}  # prompt -> max_tokens: the two longest start, three join
    params = {i: {**GREEDY, "max_tokens": n, "ignore_eos": True} for i, n in lengths.items()}
    try:
        if not gen.rows_independent:
            pytest.skip("this CPU's kernels change a row's numbers with its company: greedy requests decode alone")
        alone = {i: await reference.generate(f"a{i}", prompt_ids=prompts[i], sampling_params=params[i])
                 for i in lengths}
        first = [asyncio.create_task(gen.generate(f"g{i}", prompt_ids=prompts[i], sampling_params=params[i]))
                 for i in (3, 1)]
        calls = gate.calls
        later = [await submit_during(gate, calls + step, gen, f"g{i}", prompts[i], params[i])
                 for i, step in ((0, 3), (4, 6), (2, 14))]
        got = await asyncio.gather(*first, *later)
    finally:
        await reference.aclose()
        await gen.aclose()
    for index, out in zip((3, 1, 0, 4, 2), got, strict=True):
        assert (out.token_ids, out.log_probs) == (alone[index].token_ids, alone[index].log_probs), index
    # greedy prompts are prefilled alone and merged with room for max_batch_size rows, so all three joined in place
    assert gen.stats["joins_in_place"] == 3 and gen.stats["joins_copied"] == 0, gen.stats


async def test_greedy_rows_share_decode_steps_where_the_probe_passes(bf16_model: Any,
                                                                     prompts: list[list[int]]) -> None:
    gen = HFGenerator(bf16_model, [2], pad_token_id=0, batch_wait_s=0.05, batch_invariant_greedy=True)
    try:
        if not gen.rows_independent:
            pytest.skip("this CPU's kernels change a row's numbers with its company: greedy requests decode alone")
        outputs = await asyncio.gather(*(gen.generate(f"g{i}", prompt_ids=p, sampling_params=GREEDY)
                                         for i, p in enumerate(prompts)))
        assert gen.stats["max_rows"] == len(prompts) and gen.stats["streams"] == 1
        assert gen.stats["decode_steps"] < sum(len(out.token_ids) for out in outputs) / 2
    finally:
        await gen.aclose()
    fallback = HFGenerator(bf16_model, [2], pad_token_id=0, batch_wait_s=0.05, batch_invariant_greedy=True)
    fallback.rows_independent = False
    try:
        await asyncio.gather(*(fallback.generate(f"g{i}", prompt_ids=p, sampling_params=GREEDY)
                               for i, p in enumerate(prompts)))
        assert fallback.stats["max_rows"] == 1 and fallback.stats["streams"] == len(prompts)
    finally:
        await fallback.aclose()


async def test_greedy_prompts_arriving_together_share_chunk_passes(bf16_model: Any,
                                                                    prompts: list[list[int]]) -> None:
    """Five prompts sharing a 150-token opening, cold cache: the chunks at each position are computed in one
    pass for all prompts there (and the opening's reused by none: they all start together), with the bits
    each prompt gets alone."""
    reference = HFGenerator(bf16_model, [2], pad_token_id=0, batch_invariant_greedy=True, chunk_cache_mb=0)
    together = HFGenerator(bf16_model, [2], pad_token_id=0, batch_wait_s=0.1, batch_invariant_greedy=True)
    try:
        alone = await _greedy_alone(reference, prompts)
        passes_alone = reference.stats["chunk_passes"]
        assert passes_alone == sum(-(-len(p) // 64) for p in prompts)  # every chunk of every prompt
        outputs = await asyncio.gather(*(together.generate(f"g{i}", prompt_ids=p, sampling_params=GREEDY)
                                         for i, p in enumerate(prompts)))
        assert [(out.token_ids, out.log_probs) for out in outputs] == alone
        assert together.stats["streams"] == 1
        assert together.stats["chunk_passes"] <= max(-(-len(p) // 64) for p in prompts) + len(prompts)
        assert together.stats["chunk_passes"] < passes_alone
    finally:
        await reference.aclose()
        await together.aclose()


async def test_a_weight_load_empties_the_chunk_cache(bf16_model: Any, prompts: list[list[int]]) -> None:
    gen = HFGenerator(bf16_model, [2], pad_token_id=0, batch_invariant_greedy=True)
    try:
        await gen.generate("g", prompt_ids=prompts[0], sampling_params=GREEDY)
        assert gen.chunk_cache._entries
        gen.load_weights([("model.norm.weight", bf16_model.model.norm.weight.detach().clone())])
        assert not gen.chunk_cache._entries
    finally:
        await gen.aclose()
    with pytest.raises(ValueError, match="chunk_cache_mb"):
        HFGenerator(bf16_model, [2], pad_token_id=0, chunk_cache_mb=-1)
