"""HFGenerator: the batched CPU generator behind verl's ``generate(request_id, *, prompt_ids, sampling_params)``.

Runs the real ``tiny-test`` model (fp32, 2 layers). Oracles are independent of the code under test:
``model.generate`` for greedy tokens, a teacher-forced forward pass for log-probs, and the same request run
alone for batch invariance. Waits on the worker thread use events, never wall-clock sleeps.
"""

from __future__ import annotations

import asyncio
import copy
import math
import threading
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from agentevolver.backends.cpu import GenerationError, GeneratorClosedError, HFGenerator
from agentevolver.backends.cpu.generator import TokenOutput
from agentevolver.models import resolve_model_path

EOS = 2  # tiny-test's "<|im_end|>"
PAD = 0
GREEDY = {"temperature": 0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
TIMEOUT_S = 60  # a safety net against hangs only; nothing asserts on time

QUESTIONS = [
    "Hi",
    "What is 2+2?",
    "Name three colours.",
    "Write one sentence about the sea and the sky at dawn, please, in plain words.",
    "ok, thanks",
    "Translate 'cat' into French and Spanish.",
    "Why is the sky blue? Answer briefly.",
    "List the first five prime numbers, separated by commas, and nothing else at all.",
]


@pytest.fixture(scope="module")
def tiny_path() -> str:
    return resolve_model_path("tiny-test")


@pytest.fixture(scope="module")
def tokenizer(tiny_path: str) -> Any:
    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="module")
def model(tiny_path: str) -> Any:
    """Shared, never modified: tests that change weights or patch forward use their own copy."""
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    """Eight plain-text prompts of different lengths (1 to 18 tokens).

    Not chat-templated: random tiny-test mostly echoes its last input token, and every chat prompt ends in
    "assistant\n", so all of them would get the same answer and batch mix-ups would go unnoticed.
    """
    out = [tokenizer.encode(question, add_special_tokens=False) for question in QUESTIONS]
    assert len({len(p) for p in out}) == len(out)
    return out


@pytest.fixture
async def generator(model: Any):
    gen = HFGenerator(model, [EOS], pad_token_id=PAD, seed=0, default_max_tokens=8)
    yield gen
    await gen.aclose()


def hf_greedy(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Reference greedy tokens from transformers' own generate (EOS disabled: tiny-test never ends)."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
            pad_token_id=PAD,
        )
    return out[0, len(prompt):].tolist()


def teacher_forced_logprobs(model: Any, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) at each response token, from one forward pass over prompt + response."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    scale = temperature if temperature > 0 else 1.0
    logprobs = torch.log_softmax(logits[len(prompt) - 1: -1] / scale, dim=-1)
    return logprobs.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()


async def generate_all(gen: HFGenerator, prompts: list[list[int]], params: list[dict[str, Any]]) -> list[TokenOutput]:
    """Issue every request concurrently, as many episodes awaiting at once do."""
    return await asyncio.gather(*[
        gen.generate(f"r{i}", prompt_ids=p, sampling_params=sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ])


# -- batching and greedy correctness ------------------------------------------------------------------------


async def test_greedy_alone_matches_transformers_generate(generator: HFGenerator, model: Any,
                                                          prompts: list[list[int]]) -> None:
    for prompt in prompts[:3]:
        out = await generator.generate("a", prompt_ids=prompt, sampling_params={**GREEDY, "max_tokens": 8})
        assert isinstance(out, TokenOutput)
        assert out.token_ids == hf_greedy(model, prompt, 8)
        assert out.stop_reason == "length"


async def test_a_temperature_too_small_to_divide_by_is_greedy(generator: HFGenerator, model: Any,
                                                              prompts: list[list[int]]) -> None:
    """vLLM's rule: below 1e-5 the temperature means greedy (dividing by 1e-300 made inf logits, NaN
    probabilities and a 500 from the LLM server; found by its schema fuzz)."""
    prompt = prompts[0]
    out = await generator.generate("tiny-t", prompt_ids=prompt,
                                   sampling_params={"temperature": 1e-300, "max_tokens": 8, "logprobs": 0})
    assert out.token_ids == hf_greedy(model, prompt, 8)


async def test_greedy_is_batch_invariant(generator: HFGenerator, prompts: list[list[int]]) -> None:
    params = {**GREEDY, "max_tokens": 12}
    alone = [await generator.generate(f"a{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts)]
    assert generator.stats["batches"] == len(prompts)

    batched = await generate_all(generator, prompts, [params] * len(prompts))

    assert generator.stats["max_rows"] > 1
    for a, b in zip(alone, batched, strict=True):
        assert b.token_ids == a.token_ids
        assert b.log_probs == pytest.approx(a.log_probs, abs=1e-4)


async def test_concurrent_requests_share_batches(generator: HFGenerator, prompts: list[list[int]]) -> None:
    await generate_all(generator, prompts, [{**GREEDY, "max_tokens": 4}] * len(prompts))
    assert generator.stats["requests"] == len(prompts)
    assert generator.stats["rows"] == len(prompts)
    assert generator.stats["batches"] < len(prompts)
    assert generator.stats["generated_tokens"] == 4 * len(prompts)


async def test_mixed_settings_share_one_batch(generator: HFGenerator, prompts: list[list[int]]) -> None:
    """Rows keep their own settings inside a batch: greedy rows equal their solo output next to sampled ones."""
    sampled = {"temperature": 0.9, "top_p": 0.8, "top_k": 40, "repetition_penalty": 1.3, "max_tokens": 6}
    params = [{**GREEDY, "max_tokens": 6} if i % 2 == 0 else sampled for i in range(len(prompts))]
    batched = await generate_all(generator, prompts, params)
    assert generator.stats["batches"] < len(prompts)
    for i in range(0, len(prompts), 2):
        alone = await generator.generate("g", prompt_ids=prompts[i], sampling_params=params[i])
        assert batched[i].token_ids == alone.token_ids
    assert all(out.log_probs is None for out in batched[1::2])  # logprobs not requested


@pytest.mark.parametrize(
    "sampling",
    [
        {"repetition_penalty": 1e300, "temperature": 1.1e-5},
        {"repetition_penalty": 1e-300, "temperature": 1.0, "top_p": 0.5},
        {"repetition_penalty": 1e40, "temperature": 1e300, "top_k": 5},
    ],
    ids=["huge-penalty", "tiny-penalty", "huge-temperature"],
)
async def test_extreme_finite_settings_still_sample(generator: HFGenerator, prompts: list[list[int]],
                                                    sampling: dict[str, Any]) -> None:
    """Values past float32's range (the schema fuzz sent repetition_penalty=1e300) draw tokens, not NaN errors."""
    out = await generator.generate("x", prompt_ids=prompts[0],
                                   sampling_params={**sampling, "logprobs": True, "max_tokens": 4, "seed": 1})
    assert len(out.token_ids) == len(out.log_probs) == 4
    assert all(math.isfinite(lp) and lp <= 0 for lp in out.log_probs)


# -- log-probs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 1.0},
        {"temperature": 0.7},
        # Filters and the penalty change what is drawn, never the reported log-prob (verl's actor ignores them).
        {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.2},
        {"temperature": 0},
    ],
    ids=["T1", "T0.7", "T0.7-filtered", "greedy"],
)
async def test_logprobs_equal_teacher_forced_forward(generator: HFGenerator, model: Any, prompts: list[list[int]],
                                                     sampling: dict[str, Any]) -> None:
    params = [{**sampling, "logprobs": True, "max_tokens": 10, "seed": i} for i in range(4)]
    outs = await generate_all(generator, prompts[:4], params)
    for prompt, out in zip(prompts[:4], outs, strict=True):
        expected = teacher_forced_logprobs(model, prompt, out.token_ids, sampling["temperature"])
        assert out.log_probs == pytest.approx(expected, abs=1e-4)


async def test_logprobs_only_when_asked(generator: HFGenerator, prompts: list[list[int]]) -> None:
    out = await generator.generate("x", prompt_ids=prompts[0], sampling_params={"temperature": 0, "max_tokens": 3})
    assert out.log_probs is None
    assert len(out.token_ids) == 3


# -- stopping ---------------------------------------------------------------------------------------------------


async def test_each_row_stops_at_its_own_max_tokens(generator: HFGenerator, prompts: list[list[int]]) -> None:
    limits = [1, 3, 5, 8, 2, 7, 4, 6]
    outs = await generate_all(generator, prompts, [{**GREEDY, "max_tokens": n} for n in limits])
    for prompt, limit, out in zip(prompts, limits, outs, strict=True):
        assert len(out.token_ids) == len(out.log_probs) == limit
        assert out.stop_reason == "length"
        assert EOS not in out.token_ids
        full = await generator.generate("full", prompt_ids=prompt, sampling_params={**GREEDY, "max_tokens": 8})
        assert out.token_ids == full.token_ids[:limit]


async def test_default_max_tokens_applies(generator: HFGenerator, prompts: list[list[int]]) -> None:
    out = await generator.generate("d", prompt_ids=prompts[1], sampling_params={"temperature": 0})
    assert len(out.token_ids) == 8  # the fixture's default_max_tokens


def first_new_token(tokens: list[int]) -> int:
    """Index of the first token that did not occur before it (past index 0 when there is one)."""
    return next((i for i in range(1, len(tokens)) if tokens[i] not in tokens[:i]), 0)


async def test_stop_token_ends_generation_and_is_included(generator: HFGenerator, prompts: list[list[int]]) -> None:
    free = [await generator.generate("f", prompt_ids=p, sampling_params={**GREEDY, "max_tokens": 16}) for p in prompts]
    row = max(range(len(prompts)), key=lambda i: first_new_token(free[i].token_ids))
    cut = first_new_token(free[row].token_ids)
    stop = free[row].token_ids[cut]
    other = next(i for i in range(len(prompts)) if stop not in free[i].token_ids)

    outs = await generate_all(
        generator,
        [prompts[row], prompts[other]],
        [{**GREEDY, "max_tokens": 16, "stop_token_ids": [stop]}, {**GREEDY, "max_tokens": 16}],
    )

    assert outs[0].token_ids == free[row].token_ids[: cut + 1]
    assert outs[0].token_ids[-1] == stop
    assert len(outs[0].log_probs) == cut + 1
    assert outs[0].stop_reason == "completed"
    assert outs[1].token_ids == free[other].token_ids  # another row's stop ids do not stop this one
    assert outs[1].stop_reason == "length"


async def test_eos_ends_generation_unless_ignored(model: Any, prompts: list[list[int]]) -> None:
    """EOS is whatever the generator was built with: make it a token greedy tiny-test emits."""
    probe = HFGenerator(model, [EOS], pad_token_id=PAD)
    free = await probe.generate("p", prompt_ids=prompts[3], sampling_params={**GREEDY, "max_tokens": 16})
    await probe.aclose()
    cut = first_new_token(free.token_ids)
    gen = HFGenerator(model, [free.token_ids[cut]], pad_token_id=PAD)
    try:
        stopped = await gen.generate("s", prompt_ids=prompts[3], sampling_params={**GREEDY, "max_tokens": 16})
        ignored = await gen.generate(
            "i", prompt_ids=prompts[3], sampling_params={**GREEDY, "max_tokens": 16, "ignore_eos": True}
        )
    finally:
        await gen.aclose()
    assert stopped.token_ids == free.token_ids[: cut + 1]
    assert stopped.stop_reason == "completed"
    assert ignored.token_ids == free.token_ids
    assert ignored.stop_reason == "length"


# -- sampling determinism ------------------------------------------------------------------------------------


async def test_generator_seed_makes_sampling_reproducible(model: Any, prompts: list[list[int]]) -> None:
    params = [{"temperature": 1.0, "max_tokens": 8}] * 4
    runs = []
    for _ in range(2):
        gen = HFGenerator(model, [EOS], pad_token_id=PAD, seed=123)
        runs.append([o.token_ids for o in await generate_all(gen, prompts[:4], params)])
        await gen.aclose()
    assert runs[0] == runs[1]
    assert len({tuple(t) for t in runs[0]}) > 1


async def test_request_seed_does_not_depend_on_batch_mates(generator: HFGenerator, prompts: list[list[int]]) -> None:
    seeded = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 8, "seed": 7}
    alone = await generator.generate("s", prompt_ids=prompts[2], sampling_params=seeded)
    others = [{"temperature": 0.8, "max_tokens": 8}] * 5
    outs = await generate_all(generator, [prompts[2], *prompts[3:8]], [seeded, *others])
    assert outs[0].token_ids == alone.token_ids


# -- validation ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "8"}, "max_tokens"),
        ({"max_tokens": None, "max_new_tokens": -3}, "max_new_tokens"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [49152]}, "stop_token_ids"),
        ({"seed": "s"}, "seed"),
        ({"ignore_eos": "no"}, "ignore_eos"),
    ],
)
async def test_bad_sampling_params_name_the_key(generator: HFGenerator, prompts: list[list[int]],
                                                params: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=rf"sampling_params\.{key}\b"):
        await generator.generate("bad", prompt_ids=prompts[0], sampling_params={"max_tokens": 4, **params})
    assert generator.stats["requests"] == 0


async def test_error_messages_give_the_allowed_range(generator: HFGenerator, prompts: list[list[int]]) -> None:
    with pytest.raises(ValueError, match=r"sampling_params\.temperature must be >= 0.*got -1"):
        await generator.generate("t", prompt_ids=prompts[0], sampling_params={"temperature": -1})
    with pytest.raises(ValueError, match=r"sampling_params\.top_p must be in \(0, 1\]; got 0"):
        await generator.generate("p", prompt_ids=prompts[0], sampling_params={"top_p": 0})


async def test_max_tokens_required_without_default(model: Any, prompts: list[list[int]]) -> None:
    gen = HFGenerator(model, [EOS], pad_token_id=PAD)
    with pytest.raises(ValueError, match=r"sampling_params\.max_tokens is required"):
        await gen.generate("m", prompt_ids=prompts[0], sampling_params={"temperature": 0})
    await gen.aclose()


async def test_unknown_keys_are_ignored(generator: HFGenerator, prompts: list[list[int]]) -> None:
    params = {**GREEDY, "max_tokens": 3, "priority": 5, "n": 1, "detokenize": False, "presence_penalty": 0.0}
    out = await generator.generate("u", prompt_ids=prompts[0], sampling_params=params)
    assert len(out.token_ids) == 3


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "message"),
    [
        ([], 4, "prompt_ids is empty"),
        ([5, 49152], 4, r"prompt_ids must hold integers in \[0, 49152\)"),
        ([5, -1], 4, r"prompt_ids must hold integers"),
        ([5] * 4090, 8, "exceeds the model's max_position_embeddings"),
    ],
    ids=["empty", "beyond-vocab", "negative", "too-long"],
)
async def test_bad_prompts_are_rejected(generator: HFGenerator, prompt: list[int], max_tokens: int,
                                        message: str) -> None:
    with pytest.raises(ValueError, match=message):
        await generator.generate("p", prompt_ids=prompt, sampling_params={"max_tokens": max_tokens})


async def test_prompt_filling_the_context_exactly_is_accepted(generator: HFGenerator) -> None:
    out = await generator.generate("edge", prompt_ids=[5] * 4094, sampling_params={**GREEDY, "max_tokens": 2})
    assert len(out.token_ids) == 2


async def test_multimodal_input_is_rejected(generator: HFGenerator, prompts: list[list[int]]) -> None:
    with pytest.raises(ValueError, match="image_data is not supported"):
        await generator.generate("m", prompt_ids=prompts[0], sampling_params={}, image_data=[object()])
    out = await generator.generate("n", prompt_ids=prompts[0], sampling_params={"max_tokens": 2}, image_data=None)
    assert len(out.token_ids) == 2


# -- weights -------------------------------------------------------------------------------------------------


@pytest.fixture
def own_model(model: Any) -> Any:
    return copy.deepcopy(model)


@pytest.fixture
def other_model(model: Any) -> Any:
    """Same architecture, differently seeded random weights (stands in for the trainer's updated model)."""
    torch.manual_seed(987)
    return LlamaForCausalLM(copy.deepcopy(model.config)).eval()


async def test_load_weights_switches_to_the_new_model(own_model: Any, other_model: Any,
                                                       prompts: list[list[int]]) -> None:
    gen = HFGenerator(own_model, [EOS], pad_token_id=PAD)
    params = {**GREEDY, "max_tokens": 8}
    try:
        before = await generate_all(gen, prompts[:4], [params] * 4)
        loaded = gen.load_weights(other_model.state_dict().items())  # includes the tied lm_head alias
        after = await generate_all(gen, prompts[:4], [params] * 4)
    finally:
        await gen.aclose()
    assert loaded == len(other_model.state_dict())
    assert gen.stats["weight_loads"] == 1
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    assert [o.token_ids for o in after] == [hf_greedy(other_model, p, 8) for p in prompts[:4]]


def test_load_weights_rejects_unknown_names_and_shapes_without_changing_anything(own_model: Any) -> None:
    gen = HFGenerator(own_model, [EOS], pad_token_id=PAD)
    original = {name: p.clone() for name, p in own_model.named_parameters()}
    norm = "model.norm.weight"
    with pytest.raises(KeyError, match=r"no parameter 'model\.nrom\.weight'"):
        gen.load_weights([(norm, torch.zeros(128)), ("model.nrom.weight", torch.zeros(128))])
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(64,\); the model's is \(128,\)"):
        gen.load_weights([(norm, torch.zeros(64))])
    for name, param in own_model.named_parameters():
        assert torch.equal(param, original[name]), name
    assert gen.load_weights([(norm, torch.full((128,), 2.0, dtype=torch.float64))]) == 1
    assert torch.equal(own_model.model.norm.weight, torch.full((128,), 2.0))


# -- failures and shutdown ------------------------------------------------------------------------------------


async def test_a_failing_batch_fails_its_requests_and_the_generator_keeps_serving(
    own_model: Any, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_forward = own_model.forward
    calls = {"n": 0}

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(own_model, "forward", failing_once)
    gen = HFGenerator(own_model, [EOS], pad_token_id=PAD)
    params = {**GREEDY, "max_tokens": 4}
    try:
        results = await asyncio.gather(
            *[gen.generate(f"f{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts[:3])],
            return_exceptions=True,
        )
        assert all(isinstance(r, GenerationError) for r in results), results
        assert all(isinstance(r.__cause__, RuntimeError) for r in results)
        assert "simulated kernel failure" in str(results[0])
        assert gen.stats["failed_batches"] == 1

        later = await gen.generate("ok", prompt_ids=prompts[0], sampling_params=params)
    finally:
        await gen.aclose()
    assert later.token_ids == hf_greedy(own_model, prompts[0], 4)


async def test_a_crashed_batching_task_fails_waiters_and_restarts(generator: HFGenerator, prompts: list[list[int]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[Any]:
        raise RuntimeError("bug in batching")

    monkeypatch.setattr(generator, "_take_batch", broken)
    with pytest.raises(GenerationError, match="batching task failed"):
        await asyncio.wait_for(
            generator.generate("x", prompt_ids=prompts[0], sampling_params={"max_tokens": 2}), TIMEOUT_S
        )
    monkeypatch.undo()
    out = await generator.generate("y", prompt_ids=prompts[0], sampling_params={"max_tokens": 2})
    assert len(out.token_ids) == 2


class Gate:
    """Holds the model's forward pass in the worker thread until the test opens it."""

    def __init__(self, model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        real_forward = model.forward

        def gated(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            if not self.opened.wait(TIMEOUT_S):
                raise TimeoutError("gate never opened")
            return real_forward(*args, **kwargs)

        monkeypatch.setattr(model, "forward", gated)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, TIMEOUT_S)


async def test_aclose_aborts_running_and_queued_requests(own_model: Any, prompts: list[list[int]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(own_model, monkeypatch)
    gen = HFGenerator(own_model, [EOS], pad_token_id=PAD, max_batch_size=1)
    params = {**GREEDY, "max_tokens": 16}
    running = asyncio.create_task(gen.generate("run", prompt_ids=prompts[0], sampling_params=params))
    await gate.wait_entered()  # the first batch is inside the model
    queued = [asyncio.create_task(gen.generate(f"q{i}", prompt_ids=p, sampling_params=params))
              for i, p in enumerate(prompts[1:3])]
    await asyncio.sleep(0)  # let the queued requests enqueue

    closing = asyncio.create_task(gen.aclose())
    await asyncio.sleep(0)  # aclose has flagged the running batch to stop
    gate.opened.set()
    await asyncio.wait_for(closing, TIMEOUT_S)

    first = await running
    assert first.stop_reason == "aborted"
    assert 1 <= len(first.token_ids) < 16
    for task in queued:
        out = await task
        assert out.stop_reason == "aborted"
        assert out.token_ids == []
    assert gen.stats["aborted"] == 3
    with pytest.raises(GeneratorClosedError):
        await gen.generate("late", prompt_ids=prompts[0], sampling_params=params)


async def test_a_cancelled_caller_leaves_the_batch(own_model: Any, prompts: list[list[int]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gate = Gate(own_model, monkeypatch)
    gen = HFGenerator(own_model, [EOS], pad_token_id=PAD, max_batch_size=1)
    params = {**GREEDY, "max_tokens": 4}
    first = asyncio.create_task(gen.generate("a", prompt_ids=prompts[0], sampling_params=params))
    await gate.wait_entered()
    await asyncio.sleep(0.01)  # the event loop keeps running other work while the model is busy
    assert not first.done()
    doomed = asyncio.create_task(gen.generate("b", prompt_ids=prompts[1], sampling_params=params))
    await asyncio.sleep(0)
    doomed.cancel()
    gate.opened.set()
    try:
        assert len((await asyncio.wait_for(first, TIMEOUT_S)).token_ids) == 4
        with pytest.raises(asyncio.CancelledError):
            await doomed
        after = await gen.generate("c", prompt_ids=prompts[2], sampling_params=params)
    finally:
        await gen.aclose()
    assert len(after.token_ids) == 4
    assert gen.stats["rows"] == 2  # the cancelled request never ran


# -- loading -------------------------------------------------------------------------------------------------


async def test_from_pretrained_reads_eos_from_the_tokenizer(tokenizer: Any, prompts: list[list[int]]) -> None:
    gen = HFGenerator.from_pretrained("tiny-test", default_max_tokens=4)
    try:
        assert tokenizer.convert_tokens_to_ids("<|im_end|>") in gen.eos_token_ids
        assert gen.pad_token_id == tokenizer.pad_token_id
        assert gen.tokenizer is not None
        assert gen.model.config._attn_implementation == "sdpa"
        out = await gen.generate("x", prompt_ids=prompts[0], sampling_params={"temperature": 0})
        assert len(out.token_ids) == 4
    finally:
        await gen.aclose()


def test_from_pretrained_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="dtype must be auto or one of"):
        HFGenerator.from_pretrained("tiny-test", dtype="float8")


@pytest.mark.slow
async def test_smollm2_answers_and_stops_at_im_end() -> None:
    gen = HFGenerator.from_pretrained("smollm2-135m-instruct", default_max_tokens=48)
    tok = gen.tokenizer
    questions = ["What is 2+2?", "What is the capital of France?", "Say hello.", "Name a colour."]
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           tokenize=False), add_special_tokens=False)
        for q in questions
    ]
    params = {**GREEDY, "max_tokens": 48}
    try:
        alone = [await gen.generate(f"a{i}", prompt_ids=p, sampling_params=params) for i, p in enumerate(prompts)]
        batched = await generate_all(gen, prompts, [params] * len(prompts))
    finally:
        await gen.aclose()
    assert "Paris" in tok.decode(alone[1].token_ids)
    for a, b in zip(alone, batched, strict=True):
        assert a.stop_reason == "completed"
        assert a.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
        assert b.token_ids == a.token_ids


# ----------------------------------------------------------------------------------------- shared-prefix cache
def _prefixed_prompts(tok: Any) -> list[list[int]]:
    shared = tok.encode("You are a careful assistant. " * 40, add_special_tokens=False)
    tails = ["Count to three:", "Name a colour please", "What is two plus two?", "Say hi"]
    return [shared + tok.encode(t, add_special_tokens=False) for t in tails]


async def test_shared_prefix_cache_changes_no_token_and_is_reused() -> None:
    """Greedy ids and logprobs with the prefix cache equal those without it; the second batch reuses it."""
    plain = HFGenerator.from_pretrained("tiny-test", prefix_cache_entries=0, max_batch_size=8, batch_wait_s=0.05)
    cached = HFGenerator.from_pretrained("tiny-test", max_batch_size=8, batch_wait_s=0.05)
    prompts = _prefixed_prompts(cached.tokenizer)
    params = {"temperature": 0.0, "max_tokens": 12, "logprobs": True}
    try:
        for _ in range(2):
            want = await asyncio.gather(*(plain.generate(f"p{i}", prompt_ids=p, sampling_params=params)
                                          for i, p in enumerate(prompts)))
            got = await asyncio.gather(*(cached.generate(f"c{i}", prompt_ids=p, sampling_params=params)
                                         for i, p in enumerate(prompts)))
            assert [g.token_ids for g in got] == [w.token_ids for w in want]
            for g, w in zip(got, want, strict=True):
                assert g.log_probs == pytest.approx(w.log_probs, abs=1e-4)
        assert cached.prefix_cache.stats["misses"] == 1 and cached.prefix_cache.stats["hits"] >= 1
        assert cached.stats["prefix_cached_tokens"] > 0 and plain.stats["prefix_cached_tokens"] == 0
        # a weight update invalidates the cached keys/values
        cached.load_weights(list(cached.model.named_parameters())[:1])
        assert cached.prefix_cache._entries == {}
    finally:
        await plain.aclose()
        await cached.aclose()


def test_common_prefix_length() -> None:
    from agentevolver.backends.cpu.prefix_cache import common_prefix_length

    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 3
