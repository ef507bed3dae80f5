"""The CPU generator's one-token decode attention equals transformers' SDPA attention (agentevolver/backends/cpu/
decode_attention.py): same outputs on grouped-query and plain heads, with and without padding masks."""

from __future__ import annotations

import asyncio
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agentevolver.backends.cpu import decode_attention
from agentevolver.backends.cpu.generator import HFGenerator


def _module(heads: int, kv_heads: int) -> torch.nn.Module:
    module = torch.nn.Module().eval()
    module.num_key_value_groups = heads // kv_heads  # what transformers' SDPA function reads
    module.is_causal = True
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
def test_one_query_token_matches_sdpa(dtype: torch.dtype, heads: int, kv_heads: int, mask_kind: str) -> None:
    torch.manual_seed(0)
    batch, length, dim = 5, 37, 16
    query = torch.randn(batch, heads, 1, dim, dtype=dtype)
    key, value = (torch.randn(batch, kv_heads, length, dim, dtype=dtype) for _ in range(2))
    keep = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    keep[1, ..., :9] = False  # left padding of one row
    keep[3, ..., :30] = False
    mask = {"none": None, "bool": keep,
            "additive": torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)}[mask_kind]
    module = _module(heads, kv_heads)
    ours, _ = decode_attention.decode_attention_forward(module, query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (batch, 1, heads, dim) and ours.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (8, 1)])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_a_draft_block_matches_sdpa_inside_draft_blocks_only(dtype: torch.dtype, heads: int, kv_heads: int,
                                                             mask_kind: str) -> None:
    """A speculative step's block (5 query tokens per row: causal among themselves, after a cache with left
    padding and a hole) computed on the decode path equals SDPA; outside draft_blocks() it goes to SDPA."""
    torch.manual_seed(0)
    batch, length, dim, q_len = 4, 40, 16, 5
    query = torch.randn(batch, heads, q_len, dim, dtype=dtype)
    key, value = (torch.randn(batch, kv_heads, length, dim, dtype=dtype) for _ in range(2))
    keep = torch.ones(batch, 1, q_len, length, dtype=torch.bool)
    keep[1, ..., :9] = False  # left padding
    keep[2, ..., 20:24] = False  # a rejected draft's hidden columns
    keep[..., length - q_len:] = torch.tril(torch.ones(q_len, q_len, dtype=torch.bool))  # causal in the block
    mask = keep if mask_kind == "bool" else \
        torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    module = _module(heads, kv_heads)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    with decode_attention.draft_blocks():
        ours, _ = decode_attention.decode_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (batch, q_len, heads, dim)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tolerance, rtol=tolerance)
    outside, _ = decode_attention.decode_attention_forward(module, query, key, value, mask, scaling=0.3)
    assert torch.equal(outside, theirs)  # a short prefill keeps SDPA's numbers


def _three_passes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keep: torch.Tensor, groups: int,
                  scale: float) -> torch.Tensor:
    """The decode attention as it was first written: float32 scores, then scale, mask and softmax passes."""
    batch, heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    scores = torch.matmul(query.reshape(batch, kv_heads, groups * q_len, dim), key.transpose(-1, -2)).float()
    scores = (scores * scale).view(batch, kv_heads, groups, q_len, length)
    scores = scores.masked_fill(~keep[:, :, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, groups * q_len, length)
    return torch.matmul(probs, value).view(batch, heads, q_len, dim).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [64, 48])  # scale 1/8, a power of two (queries pre-scaled), and 1/sqrt(48)
@pytest.mark.parametrize("q_len", [1, 7])
def test_the_one_pass_scores_keep_the_bits_of_scaling_and_masking_after(dtype: torch.dtype, dim: int,
                                                                         q_len: int) -> None:
    """Scores are converted, scaled and masked in one add (decode_attention._masked_scores): bit for bit what
    the separate float32 passes gave, so greedy tokens do not move."""
    torch.manual_seed(1)
    batch, heads, kv_heads, length = 5, 9, 3, 300
    query = torch.randn(batch, heads, q_len, dim).to(dtype) * 3
    key = torch.randn(batch, kv_heads, length, dim).to(dtype) * 3
    value = torch.randn(batch, kv_heads, length, dim).to(dtype)
    keep = torch.rand(batch, 1, q_len, length) > 0.3
    keep[..., -1] = True
    scale = dim ** -0.5
    with decode_attention.draft_blocks():
        ours, _ = decode_attention.decode_attention_forward(_module(heads, kv_heads), query, key, value, keep,
                                                            scaling=scale)
    assert torch.equal(ours, _three_passes(query, key, value, keep, heads // kv_heads, scale))


def test_prefill_and_training_go_to_sdpa_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, bool]] = []

    def spy(module, query, *args, **kwargs):
        calls.append((query.shape[2], module.training))
        return "sdpa", None

    monkeypatch.setattr("transformers.integrations.sdpa_attention.sdpa_attention_forward", spy)
    module = _module(4, 2)
    q1, q5 = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 5, 8)
    kv = torch.randn(2, 2, 6, 8)
    assert decode_attention.decode_attention_forward(module, q5, kv, kv, None)[0] == "sdpa"  # prefill
    module.train()
    assert decode_attention.decode_attention_forward(module, q1, kv, kv, None)[0] == "sdpa"  # training
    assert calls == [(5, False), (1, True)]


def test_install_switches_only_sdpa_models() -> None:
    assert not decode_attention.install(types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="eager")))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_generator_uses_it_in_bf16_only_and_decodes_as_sdpa_does(dtype: str) -> None:
    """Greedy decoding through the generator equals greedy decoding of the same weights with SDPA."""
    from transformers import AutoModelForCausalLM

    generator = HFGenerator.from_pretrained("tiny-test", dtype=dtype, max_batch_size=4, seed=0)
    assert generator.decode_attention == (dtype == "bfloat16")
    assert generator.model.config._attn_implementation == (decode_attention.NAME if dtype == "bfloat16" else "sdpa")
    reference = AutoModelForCausalLM.from_pretrained(
        generator.model.config._name_or_path, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    prompts = [[1, 42, 7, 99, 5], [1, 8, 8], [1, 300, 12, 17]]

    async def run() -> list[list[int]]:
        outs = await asyncio.gather(*(generator.generate(f"r{i}", prompt_ids=p, sampling_params={
            "temperature": 0.0, "max_tokens": 12, "ignore_eos": True}) for i, p in enumerate(prompts)))
        await generator.aclose()
        return [list(o.token_ids) for o in outs]

    got = asyncio.run(run())
    with torch.inference_mode():
        for prompt, tokens in zip(prompts, got, strict=True):
            expected = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                          min_new_tokens=12)[0, len(prompt):].tolist()
            agree = sum(a == b for a, b in zip(tokens, expected, strict=True))
            # fp32: token for token; bf16: the first tokens agree, later ones may flip on a near tie
            assert agree == 12 if dtype == "float32" else tokens[:4] == expected[:4], (tokens, expected)
