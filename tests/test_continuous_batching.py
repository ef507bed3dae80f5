"""Continuous batching in HFGenerator: requests join a running batch at a decode step's boundary.

Runs the real ``tiny-test`` model (fp32). The oracle is transformers' own ``model.generate`` on each prompt
alone. Arrivals are placed exactly: a gate holds the worker thread inside its N-th forward pass until the test
has queued the next request, so "mid-batch" means mid-batch whatever the machine's speed (no sleeps).
"""

from __future__ import annotations

import asyncio
import copy
import threading
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentevolver.backends.cpu import HFGenerator
from agentevolver.backends.cpu.prefix_cache import PrefixCache
from agentevolver.models import resolve_model_path

EOS = 2
PAD = 0
TIMEOUT_S = 60  # a safety net against hangs only; nothing asserts on time
LONG = {"temperature": 0, "max_tokens": 40, "ignore_eos": True, "logprobs": True}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


@pytest.fixture
def model() -> Any:
    """A fresh copy per test: the gate patches its forward."""
    path = resolve_model_path("tiny-test")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    texts = ["Hi", "What is 2+2?", "Name three colours.", "Write one sentence about the sea at dawn, please.",
             "ok, thanks", "List the first five primes, separated by commas, and nothing else."]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens of ``prompt`` alone, from transformers' generate (EOS off: random tiny-test rarely ends)."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=PAD)
    return out[0, len(prompt):].tolist()


class StepGate:
    """Counts the model's forward passes and holds the worker thread inside chosen ones until released."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self._holds: dict[int, tuple[threading.Event, threading.Event]] = {}
        real_forward = model.forward

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            hold = self._holds.get(self.calls)
            if hold is not None:
                reached, released = hold
                reached.set()
                if not released.wait(TIMEOUT_S):
                    raise TimeoutError("the test never released the gate")
            return real_forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", counted)

    def hold_at(self, call: int) -> tuple[threading.Event, threading.Event]:
        self._holds[call] = (threading.Event(), threading.Event())
        return self._holds[call]


async def submit_during(gate: StepGate, call: int, gen: HFGenerator, request_id: str, prompt: list[int],
                        params: dict[str, Any]) -> asyncio.Task[Any]:
    """Queue a request while the worker is held inside forward pass ``call``; then let the worker go on."""
    reached, released = gate.hold_at(call)
    assert await asyncio.to_thread(reached.wait, TIMEOUT_S)
    task = asyncio.create_task(gen.generate(request_id, prompt_ids=prompt, sampling_params=params))
    await asyncio.sleep(0)  # generate() runs up to its await: the request is queued
    released.set()
    return task


async def test_a_request_arriving_mid_batch_joins_it_and_is_answered_before_the_batch_ends(
    model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    want_long = hf_greedy(model, prompts[3], 40)
    want_short = hf_greedy(model, prompts[0], 3)
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, batch_wait_s=0, continuous_batching=True)
    try:
        long = asyncio.create_task(gen.generate("long", prompt_ids=prompts[3], sampling_params=LONG))
        short = await submit_during(gate, 4, gen, "short", prompts[0],
                                    {"temperature": 0, "max_tokens": 3, "ignore_eos": True})
        got_short = await asyncio.wait_for(short, TIMEOUT_S)
        assert not long.done(), "the joining request waited for the running batch to end"
        got_long = await asyncio.wait_for(long, TIMEOUT_S)
    finally:
        await gen.aclose()
    assert got_short.token_ids == want_short
    assert got_long.token_ids == want_long
    assert gen.stats["joined_running"] == 1
    assert gen.stats["streams"] == 1
    assert gen.stats["max_rows"] == 2


async def test_continuous_batching_gives_the_greedy_tokens_of_one_at_a_time_generation(
    model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed stream (different prompts, lengths, max_tokens, arrival steps) equals each prompt alone, and the
    log-probs of the joined rows equal a teacher-forced forward pass."""
    lengths = [40, 7, 25, 3, 12, 30]
    want = [hf_greedy(model, p, n) for p, n in zip(prompts, lengths, strict=True)]
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, batch_wait_s=0, continuous_batching=True)
    params = [{"temperature": 0, "max_tokens": n, "ignore_eos": True, "logprobs": True} for n in lengths]
    try:
        first = [asyncio.create_task(gen.generate(f"r{i}", prompt_ids=prompts[i], sampling_params=params[i]))
                 for i in range(2)]
        later = []
        for index, call in zip(range(2, 6), (3, 6, 10, 11), strict=True):
            later.append(await submit_during(gate, call, gen, f"r{index}", prompts[index], params[index]))
        got = await asyncio.wait_for(asyncio.gather(*first, *later), TIMEOUT_S)
    finally:
        await gen.aclose()
    assert [g.token_ids for g in got] == want
    assert gen.stats["joined_running"] >= 3  # at least three arrivals found a batch still decoding
    # the first join made room for max_batch_size rows (a copy); a later, narrower joiner took a free slot
    assert gen.stats["joins_copied"] >= 1 and gen.stats["joins_in_place"] >= 1, gen.stats
    monkeypatch.undo()
    for prompt, out in zip(prompts, got, strict=True):
        with torch.inference_mode():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0].float()
        expected = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
        expected = expected.gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1).tolist()
        assert out.log_probs == pytest.approx(expected, abs=1e-4)


async def test_joiners_wait_for_join_free_rows_free_rows_then_join_before_the_batch_ends(
    model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``join_free_rows=2`` with 4 rows: a request queued while 3 rows run (1 free) waits; once the short row
    ends (2 free) it joins the running batch, and is answered before the long rows end."""
    want_late = hf_greedy(model, prompts[4], 3)
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, batch_wait_s=0, continuous_batching=True, max_batch_size=4,
                      join_free_rows=2)
    short = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
    try:
        first = [asyncio.create_task(gen.generate(f"r{i}", prompt_ids=prompts[i], sampling_params=params))
                 for i, params in ((3, LONG), (5, LONG), (0, short))]
        late = await submit_during(gate, 2, gen, "late", prompts[4],
                                   {"temperature": 0, "max_tokens": 3, "ignore_eos": True})
        got_late = await asyncio.wait_for(late, TIMEOUT_S)
        assert first[2].done(), "the late request joined while only one row was free"
        assert not first[0].done() and not first[1].done(), "the late request waited for the batch to end"
        await asyncio.wait_for(asyncio.gather(*first), TIMEOUT_S)
    finally:
        await gen.aclose()
    assert got_late.token_ids == want_late
    assert gen.stats["streams"] == 1 and gen.stats["joined_running"] == 1
    assert gen.stats["max_rows"] == 3  # never 4: it joined after the short row left


def test_join_free_rows_outside_one_to_max_batch_size_is_refused(model: Any) -> None:
    for bad in (0, 17):
        with pytest.raises(ValueError, match="join_free_rows must be between 1 and max_batch_size"):
            HFGenerator(model, [EOS], pad_token_id=PAD, continuous_batching=True, join_free_rows=bad)


async def test_without_continuous_batching_a_batch_stays_closed(
    model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``continuous_batching=False`` (the default) is the earlier behaviour: a late request waits for the batch."""
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, batch_wait_s=0, continuous_batching=False)
    try:
        long = asyncio.create_task(gen.generate("long", prompt_ids=prompts[3], sampling_params=LONG))
        short = await submit_during(gate, 4, gen, "short", prompts[0], {"temperature": 0, "max_tokens": 3})
        await asyncio.wait_for(short, TIMEOUT_S)
        assert long.done()
    finally:
        await gen.aclose()
    assert gen.stats["joined_running"] == 0
    assert gen.stats["batches"] == 2


async def test_joining_rows_keep_the_prefix_and_turn_caches_exact(
    model: Any, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows with a cached shared prefix, without one, and an episode's next turn (from the turn cache) join
    one running batch; every row's greedy tokens equal its prompt alone."""
    shared = tokenizer.encode("You are a careful assistant. " * 6, add_special_tokens=False)
    tails = ["Count to three:", "Name a colour please", "Say hi"]
    prefixed = [shared + tokenizer.encode(t, add_special_tokens=False) for t in tails]
    stranger = tokenizer.encode("A prompt that shares nothing with the others.", add_special_tokens=False)
    oracle = copy.deepcopy(model)
    gate = StepGate(model, monkeypatch)
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, batch_wait_s=0.05, continuous_batching=True)
    gen.prefix_cache = PrefixCache(block_tokens=8, min_tokens=8)
    greedy = {"temperature": 0, "ignore_eos": True}
    try:
        # turn 1 of an episode (row 0) next to a long row; the prefix is prefilled once for both
        opening = await asyncio.wait_for(asyncio.gather(
            gen.generate("turn1", prompt_ids=prefixed[0], sampling_params={**greedy, "max_tokens": 20}),
            gen.generate("other", prompt_ids=prefixed[1], sampling_params={**greedy, "max_tokens": 4}),
        ), TIMEOUT_S)
        assert gen.prefix_cache.stats["misses"] == 1
        next_turn = prefixed[0] + opening[0].token_ids + tokenizer.encode(" Now go on.", add_special_tokens=False)
        calls = gate.calls
        running = asyncio.create_task(
            gen.generate("long", prompt_ids=prefixed[2], sampling_params={**greedy, "max_tokens": 40}))
        joined = [
            await submit_during(gate, calls + 3, gen, "turn2", next_turn, {**greedy, "max_tokens": 10}),
            await submit_during(gate, calls + 5, gen, "stranger", stranger, {**greedy, "max_tokens": 10}),
        ]
        got = await asyncio.wait_for(asyncio.gather(running, *joined), TIMEOUT_S)
    finally:
        await gen.aclose()
    assert opening[0].token_ids == hf_greedy(oracle, prefixed[0], 20)
    assert got[0].token_ids == hf_greedy(oracle, prefixed[2], 40)
    assert got[1].token_ids == hf_greedy(oracle, next_turn, 10)
    assert got[2].token_ids == hf_greedy(oracle, stranger, 10)
    assert gen.turn_cache.stats["hits"] == 1  # turn 2 reused turn 1's keys/values
    assert gen.stats["joined_running"] == 2
