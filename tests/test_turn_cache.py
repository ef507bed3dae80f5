"""The turn cache (agentevolver.backends.cpu.turn_cache): a conversation's next turn prefills only its new tokens.

The oracle is the same generator with the cache off (``turn_cache_mb=0``), which prefills every prompt in
full: greedy ids must be equal and log-probs within 1e-4 (fp32 ``tiny-test``), turn after turn, with rows that
continue and fresh rows mixed in one batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from agentevolver.backends.cpu import HFGenerator
from agentevolver.backends.cpu.turn_cache import TurnCache

GREEDY = {"temperature": 0.0, "logprobs": True, "ignore_eos": True}


def _layers(tokens: int, *, layers: int = 2, heads: int = 1, dim: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.ones(heads, tokens, dim), torch.ones(heads, tokens, dim)) for _ in range(layers)]


# ------------------------------------------------------------------------------------------------ the cache alone
def test_take_returns_the_longest_entry_the_prompt_extends_and_removes_it() -> None:
    cache = TurnCache(max_bytes=10**6, min_tokens=1)
    assert cache.store([1, 2, 3, 4], 2, _layers(2))
    assert cache.store([1, 2, 3, 4, 5, 6], 2, _layers(4))
    assert cache.store([1, 2, 9, 9, 9], 2, _layers(3))
    entry = cache.take([1, 2, 3, 4, 5, 6, 7], 2)
    assert entry is not None and entry.token_ids == (1, 2, 3, 4, 5, 6) and entry.cached_len == 4
    assert cache.take([1, 2, 3, 4, 5, 6, 7], 2).token_ids == (1, 2, 3, 4)  # the longer one was taken
    assert cache.take([1, 2, 3, 4, 5, 6, 7], 2) is None
    assert len(cache) == 1 and cache.stats["hits"] == 2 and cache.stats["taken_tokens"] == 6


def test_take_needs_a_new_token_and_the_same_shared_prefix() -> None:
    cache = TurnCache(max_bytes=10**6, min_tokens=1)
    cache.store([1, 2, 3, 4], 2, _layers(2))
    assert cache.take([1, 2, 3, 4], 2) is None  # nothing left to feed: the model needs one new token
    assert cache.take([1, 2, 3, 4, 5], 0) is None  # computed after another shared prefix
    assert cache.take([1, 2, 3, 5, 6], 2) is None  # diverges
    assert cache.take([1, 2, 3, 4, 5], 2) is not None


def test_the_budget_drops_the_oldest_and_refuses_what_cannot_fit() -> None:
    one = sum(k.nbytes + v.nbytes for k, v in _layers(10))
    cache = TurnCache(max_bytes=2 * one, min_tokens=1)
    for first in (1, 2, 3):
        assert cache.store([first] * 10, 0, _layers(10))
    assert len(cache) == 2 and cache.nbytes == 2 * one and cache.stats["evicted"] == 1
    assert cache.take([1] * 11, 0) is None and cache.take([3] * 11, 0) is not None
    assert not cache.store([4] * 30, 0, _layers(30))  # larger than the whole budget
    assert not TurnCache(max_bytes=10**6, min_tokens=16).store([5] * 20, 10, _layers(10))  # too short to keep
    off = TurnCache(max_bytes=0)
    assert not off.enabled and not off.store([6] * 40, 0, _layers(40))
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


@pytest.mark.parametrize("kwargs", [{"max_bytes": -1}, {"max_bytes": 1, "min_tokens": 0}])
def test_bad_settings_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        TurnCache(**kwargs)


def test_the_generator_refuses_a_negative_budget() -> None:
    with pytest.raises(ValueError, match="turn_cache_mb must be >= 0"):
        HFGenerator.from_pretrained("tiny-test", turn_cache_mb=-1)


# ------------------------------------------------------------------------------------------ inside the generator
async def _turn(generator: HFGenerator, prompts: list[list[int]], max_tokens: list[int], tag: str) -> list[Any]:
    return await asyncio.gather(*(
        generator.generate(f"{tag}{i}", prompt_ids=p, sampling_params={**GREEDY, "max_tokens": m})
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=True))))


async def test_later_turns_reuse_earlier_turns_and_change_no_token() -> None:
    """Three turns of four conversations, a fresh conversation joining at turn 3; cache off is the oracle."""
    plain = HFGenerator.from_pretrained("tiny-test", turn_cache_mb=0, max_batch_size=8, batch_wait_s=0.05)
    cached = HFGenerator.from_pretrained("tiny-test", max_batch_size=8, batch_wait_s=0.05)
    tok = cached.tokenizer
    opening = tok.encode("You are a careful assistant. " * 40, add_special_tokens=False)
    questions = ["Count to three, slowly and clearly:", "Name a colour that you like please",
                 "What is two plus two, and why?", "Say hi to the reader of this text"]
    conversations = [opening + tok.encode(q, add_special_tokens=False) for q in questions]
    lengths = [[18, 22, 26, 30], [20, 17, 24, 19], [16, 25, 18, 21]]  # rows of different lengths each turn
    tool = tok.encode(" The tool answered: 4. Go on.", add_special_tokens=False)
    try:
        for turn, max_tokens in enumerate(lengths):
            if turn == 2:  # a new conversation shares the batch with three that continue
                conversations[3] = opening + tok.encode("A new question: what is the sea?", add_special_tokens=False)
            want = await _turn(plain, conversations, max_tokens, f"p{turn}-")
            got = await _turn(cached, conversations, max_tokens, f"c{turn}-")
            assert [g.token_ids for g in got] == [w.token_ids for w in want], f"turn {turn + 1}"
            for g, w in zip(got, want, strict=True):
                assert g.log_probs == pytest.approx(w.log_probs, abs=1e-4)
            conversations = [c + out.token_ids + tool for c, out in zip(conversations, got, strict=True)]
        hits = cached.turn_cache.stats["hits"]
        assert hits == 4 + 3, "turn 2: all four continue; turn 3: three continue, one is new"
        assert cached.stats["turn_cached_tokens"] > 0 and plain.stats["turn_cached_tokens"] == 0
        # a row uses what its entry holds, or less where a batch-mate's new tokens set a wider block (turn 3,
        # beside the fresh conversation): the batch is never wider than without the cache
        assert 0 < cached.stats["turn_cached_tokens"] <= cached.turn_cache.stats["taken_tokens"]
        # a weight update invalidates the kept keys/values
        assert len(cached.turn_cache) > 0
        cached.load_weights(list(cached.model.named_parameters())[:1])
        assert len(cached.turn_cache) == 0 and cached.turn_cache.nbytes == 0
    finally:
        await plain.aclose()
        await cached.aclose()


async def test_bf16_turns_reuse_and_match_a_full_prefill_closely() -> None:
    """bf16 with the decode-attention path: reused turns give the first tokens a full prefill gives."""
    plain = HFGenerator.from_pretrained("tiny-test", dtype="bfloat16", turn_cache_mb=0, batch_wait_s=0.05)
    cached = HFGenerator.from_pretrained("tiny-test", dtype="bfloat16", batch_wait_s=0.05)
    tok = cached.tokenizer
    conversations = [tok.encode(f"Question {i}: " + "tell me more about the weather today. " * 6,
                                add_special_tokens=False) for i in range(3)]
    try:
        first = await _turn(cached, conversations, [20, 20, 20], "c1-")
        conversations = [c + out.token_ids + tok.encode(" ok.", add_special_tokens=False)
                         for c, out in zip(conversations, first, strict=True)]
        want = await _turn(plain, conversations, [6, 6, 6], "p2-")
        got = await _turn(cached, conversations, [6, 6, 6], "c2-")
        assert cached.turn_cache.stats["hits"] == 3
        assert [g.token_ids[:2] for g in got] == [w.token_ids[:2] for w in want]
    finally:
        await plain.aclose()
        await cached.aclose()
