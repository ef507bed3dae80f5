"""Speculative decoding with prompt-lookup drafts in the CPU generator (``HFGenerator(draft_tokens=k)``).

The real ``tiny-test`` model in fp32, which mostly echoes its context, so its drafts are often right. Oracles are
independent of the code under test: transformers' own ``generate`` for greedy tokens, one teacher-forced forward
pass for every log-prob (whatever was drawn), the same generator without drafts for stops and the turn cache,
and, for the speculative-sampling test itself, frequencies over many seeded draws against the probabilities.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from test_cpu_generator import EOS, GREEDY, PAD, QUESTIONS, hf_greedy, teacher_forced_logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentevolver.backends.cpu import HFGenerator
from agentevolver.backends.cpu.sampling import RowSampler, SamplingSettings
from agentevolver.models import resolve_model_path


@pytest.fixture(scope="module")
def model() -> Any:
    return AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    return [tokenizer.encode(question, add_special_tokens=False) for question in QUESTIONS]


async def _run(generator: HFGenerator, prompts: list[list[int]], params: list[dict[str, Any]]) -> list[Any]:
    try:
        return await asyncio.gather(*[generator.generate(f"r{i}", prompt_ids=prompt, sampling_params=sampling)
                                      for i, (prompt, sampling) in enumerate(zip(prompts, params, strict=True))])
    finally:
        await generator.aclose()


async def test_greedy_with_drafts_is_transformers_greedy_and_drafts_are_kept(model: Any,
                                                                            prompts: list[list[int]]) -> None:
    generator = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=4)
    outs = await _run(generator, prompts, [{**GREEDY, "max_tokens": 20}] * len(prompts))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == hf_greedy(model, prompt, 20)
        assert out.log_probs == pytest.approx(teacher_forced_logprobs(model, prompt, out.token_ids, 0), abs=1e-4)
        assert len(out.token_ids) == 20 and out.stop_reason == "length"
    stats = generator.stats
    assert stats["draft_passes"] > 0 and 0 < stats["accepted_tokens"] <= stats["drafted_tokens"]
    # fewer forward passes than tokens: what the drafts are for
    assert stats["decode_steps"] < stats["generated_tokens"] - len(prompts)


@pytest.mark.parametrize("sampling", [{"temperature": 0.05}, {"temperature": 0.1, "top_p": 0.9, "top_k": 50}],
                         ids=["T0.05", "T0.1-filtered"])
async def test_sampled_rows_with_drafts_report_the_models_log_probs(model: Any, prompts: list[list[int]],
                                                                    sampling: dict[str, Any]) -> None:
    """Whatever is drawn, each token's log-prob is the teacher-forced one: the cache's kept and hidden columns
    and the position ids stay right through accepted and rejected drafts. Low temperatures, because the random
    model's distribution over 49k tokens is nearly flat at T = 1, where no draft would ever be accepted."""
    generator = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=6)
    params = [{**sampling, "logprobs": True, "max_tokens": 24, "seed": i, "ignore_eos": True}
              for i in range(len(prompts))]
    outs = await _run(generator, prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        assert len(out.token_ids) == 24
        expected = teacher_forced_logprobs(model, prompt, out.token_ids, sampling["temperature"])
        assert out.log_probs == pytest.approx(expected, abs=1e-4)
    assert generator.stats["accepted_tokens"] > 0
    assert generator.stats["accepted_tokens"] < generator.stats["drafted_tokens"]  # some were rejected too


async def test_in_bf16_the_block_takes_the_decode_attention_and_log_probs_stay_the_models(
        prompts: list[list[int]]) -> None:
    """bf16 switches the generator to its own decode attention, whose few-query path then serves the blocks
    (left padding, hidden columns of rejected drafts, causal order within the block); log-probs against a bf16
    teacher-forced pass, within bf16's rounding."""
    bf16 = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=torch.bfloat16,
                                                attn_implementation="sdpa").eval()
    generator = HFGenerator(bf16, [EOS], pad_token_id=PAD, seed=0, draft_tokens=6)
    assert generator.decode_attention
    params = [{"temperature": 0.05, "logprobs": True, "max_tokens": 24, "seed": i, "ignore_eos": True}
              for i in range(len(prompts))]
    outs = await _run(generator, prompts, params)
    for prompt, out in zip(prompts, outs, strict=True):
        expected = teacher_forced_logprobs(bf16, prompt, out.token_ids, 0.05)
        assert out.log_probs == pytest.approx(expected, abs=0.3)  # plain decoding here: within 0.1
    assert generator.stats["accepted_tokens"] > 0


async def test_a_stop_inside_accepted_drafts_ends_the_row_and_its_next_turn_reuses_the_cache(
        model: Any, prompts: list[list[int]]) -> None:
    prompt = prompts[3]
    free = hf_greedy(model, prompt, 24)
    stop = free[12]  # a token the greedy answer reaches late, so drafts are in flight when it comes
    params = {**GREEDY, "max_tokens": 24, "stop_token_ids": [stop]}
    plain = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0)
    drafted = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=4)
    first = [(await _run(gen, [prompt], [params]))[0] for gen in (plain, drafted)]
    assert first[1].token_ids == first[0].token_ids == free[:free.index(stop) + 1]
    assert first[1].stop_reason == "completed"
    follow = prompt + first[0].token_ids + prompts[0]  # the conversation's next turn
    again = [HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=k) for k in (0, 4)]
    for gen in again:
        await gen.generate("t1", prompt_ids=prompt, sampling_params=params)
    second = [(await _run(gen, [follow], [{**GREEDY, "max_tokens": 8}]))[0] for gen in again]
    assert second[1].token_ids == second[0].token_ids == hf_greedy(model, follow, 8)
    assert again[1].stats["turn_cached_tokens"] == again[0].stats["turn_cached_tokens"] > 0


async def test_penalties_decode_token_by_token_and_max_tokens_holds(model: Any, prompts: list[list[int]]) -> None:
    generator = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=4)
    limits = [1, 2, 3, 5, 7, 9, 11, 13]
    outs = await _run(generator, prompts, [{**GREEDY, "max_tokens": n} for n in limits])
    assert [len(out.token_ids) for out in outs] == limits
    penalised = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, draft_tokens=4)
    await _run(penalised, prompts, [{"temperature": 0.8, "repetition_penalty": 1.3, "max_tokens": 8}] * len(prompts))
    assert penalised.stats["draft_passes"] == 0  # a penalty's seen-set advances token by token
    with pytest.raises(ValueError, match="draft_tokens must be >= 0"):
        HFGenerator(model, [EOS], pad_token_id=PAD, draft_tokens=-1)


def _sampler(settings: SamplingSettings, vocab: int, seed: int) -> RowSampler:
    return RowSampler([settings], [[0]], vocab_size=vocab, shared_rng=torch.Generator().manual_seed(seed),
                      device=torch.device("cpu"))


def test_a_draft_is_accepted_with_its_probability_and_a_rejected_one_is_never_drawn_next() -> None:
    """The speculative-sampling test on known logits: p = (0.1, 0.3, 0.6) at T = 1 and a draft of token 1
    (accepted 30% of the time), then token 2 under top-k 2 at T = 1 (the kept tokens 2 and 1 renormalise to 2/3,
    1/3). After a rejection of token 1, draws split over 0 and 2 as 0.1 : 0.6."""
    logits = torch.log(torch.tensor([[0.1, 0.3, 0.6]] * 3))[None]  # [1 row, 3 positions, vocab]
    draws = 4000
    sampler = _sampler(SamplingSettings(max_tokens=8, temperature=1.0), 3, seed=0)
    accepted = [sampler.verify(logits, [[1]])[0][0] for _ in range(draws)]
    assert sum(accepted) / draws == pytest.approx(0.3, abs=0.03)
    _count, logprobs = next(result for result in (sampler.verify(logits, [[1]])[0] for _ in range(100)) if result[0])
    assert logprobs == pytest.approx([torch.log(torch.tensor(0.3)).item()], abs=1e-5)
    topk = _sampler(SamplingSettings(max_tokens=8, temperature=1.0, top_k=2), 3, seed=1)
    two = [topk.verify(logits, [[2, 1]])[0][0] for _ in range(draws)]
    assert sum(n >= 1 for n in two) / draws == pytest.approx(2 / 3, abs=0.03)
    assert sum(n == 2 for n in two) / draws == pytest.approx(2 / 3 * 1 / 3, abs=0.03)
    drawn = [int(sampler(logits[:, 0], exclude=[1])[0]) for _ in range(draws)]
    assert 1 not in drawn
    assert drawn.count(0) / draws == pytest.approx(0.1 / 0.7, abs=0.03)
    greedy = _sampler(SamplingSettings(max_tokens=8, temperature=0.0), 3, seed=0)
    assert greedy.verify(logits, [[2]])[0][0] == 1 and greedy.verify(logits, [[1]])[0][0] == 0


async def test_a_short_prefill_after_a_cached_prefix_takes_the_decode_attention(
        prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16: rows that share a cached prefix feed their remaining tokens (left-padded, up to two passes of
    ``MAX_QUERIES``) through the decode attention instead of SDPA's copy of the whole cache; their tokens'
    log-probs are the teacher-forced pass's, within bf16's rounding, and a first prompt (nothing cached yet,
    the prefix itself being computed) still goes through SDPA."""
    from agentevolver.backends.cpu import decode_attention

    bf16 = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-test"), dtype=torch.bfloat16,
                                                attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    opening = tokenizer.encode("You are a careful assistant. " * 40, add_special_tokens=False)[:192]
    # up to 25 new tokens after the 192 shared ones, each opening with its own token (the prefix ends there)
    tails = [[300 + index] + prompt[: 3 + 3 * index] * 2 for index, prompt in enumerate(prompts[:4])]
    rows = [opening + tail for tail in tails]
    blocks: list[int] = []
    few_queries = decode_attention._few_queries

    def counted(query: torch.Tensor, *args: Any) -> torch.Tensor:
        blocks.append(query.shape[2])
        return few_queries(query, *args)

    monkeypatch.setattr(decode_attention, "_few_queries", counted)
    generator = HFGenerator(bf16, [EOS], pad_token_id=PAD, seed=0, batch_wait_s=0.05)
    params = [{"temperature": 0.05, "logprobs": True, "max_tokens": 4, "seed": i, "ignore_eos": True}
              for i in range(len(rows))]
    outs = await _run(generator, rows, params)
    assert generator.stats["prefix_cached_tokens"] == 192 * len(rows)
    width = max(len(tail) for tail in tails)
    passes = -(-width // decode_attention.MAX_QUERIES)
    assert passes == 2 and blocks and blocks[0] == -(-width // passes)  # the first of two equal passes
    for prompt, out in zip(rows, outs, strict=True):
        expected = teacher_forced_logprobs(bf16, prompt, out.token_ids, 0.05)
        assert out.log_probs == pytest.approx(expected, abs=0.3)
