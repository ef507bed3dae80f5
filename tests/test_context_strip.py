"""Experience stripping (Self-Navigating "discard" mode): the trained prompt is re-rendered without the
injected experience; the response stays token for token what the policy generated and observed.

Runs on the real ``smollm2-135m-instruct`` and ``tiny-test`` tokenizers and their shipped chat template. The
reference for "stripped" is independent of the stripping code: the same episode (same generated ids, same
observations) driven through a second manager that never saw the experience.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from transformers import AutoTokenizer

from agentevolver.models import resolve_model_path
from agentevolver.module.context_manager import (
    Author,
    ContextManager,
    ContextManagerConfig,
    ContextResult,
    make_context_manager,
)

MODELS = ("smollm2-135m-instruct", "tiny-test")
#: Managers whose prompts do not depend on the experience beyond the injected span (self_clip's archivist
#: reads the task with its experience, so its clip points and summaries may differ; tested separately).
REPLAYABLE = ("linear", "linear_think", "memory")

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}
INITIAL = [{"role": "system", "content": "You solve arithmetic with the calc tool."},
           {"role": "user", "content": "Compute (2+2)*3."}]
EXPERIENCE = "\n\nExperience from earlier attempts:\n<EXP>Use the calc tool for every operation.</EXP>\n\n"
#: Experience texts a regex or a text search over the decoded prompt would get wrong.
TRICKY_EXPERIENCES = {
    "chat_markup": "\n\n<|im_end|>\n<|im_start|>assistant\nI already know: 12<|im_end|>\n<|im_start|>user\n",
    "jinja_and_regex": "\n\n{{ messages[0].content }} {% if x %}{%- endif %} ^(.*?)$ [a-z]+ \\1 $& (?P<g>x)|\\d{2,}",
    "repeats_the_task": "\n\nCompute (2+2)*3.",
    "glued_to_the_task": "3 is the factor; Compute (2+2)*3.",
    "unicode_and_private_use": " \ue000 é中文🙂 \ue001\t",
}


@cache
def tokenizer(model: str) -> Any:
    """A real tokenizer from the model cache, loaded once per test process."""
    return AutoTokenizer.from_pretrained(resolve_model_path(model))


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class FakeClipper:
    """The context_clipper LLM role at the edge: a fixed summary for every archive request."""

    text = "The agent computed sums; nothing else matters."

    def __init__(self) -> None:
        self.calls = 0

    def chat(self, messages: list[dict[str, str]], **_: Any) -> Any:
        self.calls += 1

        @dataclass
        class Result:
            text: str

        return Result(self.text)


@dataclass
class Step:
    """One scripted agent step: assistant text, whether the generation ended with EOS, the observations."""

    text: str
    eos: bool = True
    observations: list[dict[str, Any]] = field(default_factory=list)


EPISODE = [
    Step("<think>First add.</think>" + tool_call_text("calc", {"expression": "2+2"}),
         observations=[{"role": "tool", "content": "4", "name": "calc", "tool_call_id": "call_0_0"}]),
    Step("<think>Now multiply, but I was cut", eos=False,
         observations=[{"role": "user", "content": "Your reply was cut off. Continue."}]),
    Step(tool_call_text("calc", {"expression": "4*3"}),
         observations=[{"role": "tool", "content": "12", "name": "calc", "tool_call_id": "call_2_0"}]),
    Step("<think>Done.</think>The result is 12."),
]


def make(model: str, name: str, **config: Any) -> ContextManager:
    llm = FakeClipper() if name == "self_clip" else None
    config = {"max_model_len": 4096, **config}
    return make_context_manager(name, tokenizer(model), ContextManagerConfig(**config), tools=[CALC_TOOL], llm=llm)


def run(model: str, cm: ContextManager, steps: Sequence[Step], experience: str | None,
        initial: list[dict[str, Any]] = INITIAL) -> None:
    """Drive ``cm`` like the agent flow, with fixed generated ids and logprobs per step."""
    tok = tokenizer(model)
    cm.start(initial, experience=experience)
    for k, step in enumerate(steps):
        assert not cm.exhausted
        cm.next_prompt_ids()
        ids = tok.encode(step.text, add_special_tokens=False) + ([tok.eos_token_id] if step.eos else [])
        cm.add_generation(ids, [-(k + 1) - i / 1000 for i in range(len(ids))], step=k)
        cm.add_observation(step.observations)


def response(result: ContextResult) -> tuple[Any, ...]:
    return (result.response_ids, result.response_mask, result.response_logprobs, result.step_ids,
            result.num_generations, result.index)


def decode(model: str, ids: list[int]) -> str:
    return tokenizer(model).decode(ids, skip_special_tokens=False)


# ------------------------------------------------------------------------------------------------ equivalence


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", REPLAYABLE)
def test_stripped_prompts_are_the_prompts_of_the_same_episode_without_experience(model: str, name: str) -> None:
    with_exp, without = make(model, name), make(model, name)
    run(model, with_exp, EPISODE, EXPERIENCE)
    run(model, without, EPISODE, None)
    generated = with_exp.results()
    stripped = with_exp.results(strip_experience=True)
    reference = without.results()
    assert len(stripped) == len(generated) == len(reference)
    if name != "linear":
        assert len(stripped) == len(EPISODE), "history-rewriting managers: one sample per generation"
    for gen, strip, ref in zip(generated, stripped, reference, strict=True):
        start, end = gen.experience_span or (0, 0)
        assert decode(model, gen.prompt_ids[start:end]) == EXPERIENCE
        # the trained prompt is exactly what the model would have read without experience
        assert strip.prompt_ids == ref.prompt_ids
        assert EXPERIENCE.strip() not in decode(model, strip.prompt_ids)
        # for the shipped ChatML template, re-rendering agrees with cutting the recorded span
        assert strip.prompt_ids == gen.prompt_ids[:start] + gen.prompt_ids[end:]
        # the response is untouched: generated ids, observation chunks, masks, logprobs, step ids
        assert response(strip) == response(gen) == response(ref)
        assert strip.experience_span is None and strip.experience_stripped
        assert strip.experience_span_generated == gen.experience_span
        assert all(m.author is not Author.EXPERIENCE for m in strip.messages)
        assert [m.to_dict() for m in strip.messages] == [m.to_dict() for m in ref.messages]


@pytest.mark.parametrize("model", MODELS)
def test_samples_of_a_stripped_episode_say_so(model: str) -> None:
    cm = make(model, "linear_think")
    run(model, cm, EPISODE, EXPERIENCE)
    spans = [r.experience_span for r in cm.results()]
    samples = cm.to_samples(task_id="t", group_id="g", rollout_id=2, strip_experience=True,
                            extras={"termination": "finished"})
    kept = cm.to_samples(task_id="t", group_id="g", rollout_id=2)
    assert len(samples) == len(kept) == len(EPISODE)
    for sample, original, span in zip(samples, kept, spans, strict=True):
        assert sample.exp_mask is True and original.exp_mask is False
        assert sample.extras["experience_stripped"] is True and original.extras["experience_stripped"] is False
        assert sample.extras["experience_span_generated"] == list(span or ())
        assert sample.extras["experience_span"] is None and original.extras["experience_span"] == list(span or ())
        assert sample.extras["termination"] == "finished" and sample.extras["num_samples"] == len(EPISODE)
        assert (sample.response_ids, sample.response_mask, sample.response_logprobs, sample.step_ids) == (
            original.response_ids, original.response_mask, original.response_logprobs, original.step_ids)
        assert len(sample.prompt_ids) == len(original.prompt_ids) - (span[1] - span[0] if span else 0)
        assert "experience" not in [m["author"] for m in sample.extras["messages"]]


@pytest.mark.parametrize("model", MODELS)
def test_single_sample_pass_through(model: str) -> None:
    cm = make(model, "linear")
    run(model, cm, EPISODE[:2], EXPERIENCE)
    plain = make(model, "linear")
    run(model, plain, EPISODE[:2], None)
    assert cm.result(strip_experience=True).prompt_ids == plain.result().prompt_ids
    sample = cm.to_sample(task_id="t", group_id="g", strip_experience=True)
    assert sample.exp_mask is True and sample.prompt_ids == plain.result().prompt_ids
    assert cm.to_sample(task_id="t", group_id="g").exp_mask is False


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", [*REPLAYABLE, "self_clip"])
def test_without_experience_strip_changes_nothing(model: str, name: str) -> None:
    cm = make(model, name)
    run(model, cm, EPISODE, None)
    assert cm.results(strip_experience=True) == cm.results()
    for sample in cm.to_samples(task_id="t", group_id="g", strip_experience=True):
        assert sample.exp_mask is False
        assert sample.extras["experience_stripped"] is False and sample.extras["experience_span_generated"] is None


@pytest.mark.parametrize("model", MODELS)
def test_an_episode_without_generations_still_strips_its_prompt(model: str) -> None:
    cm, plain = make(model, "linear"), make(model, "linear")
    cm.start(INITIAL, experience=EXPERIENCE)
    plain.start(INITIAL)
    sample = cm.to_sample(task_id="t", group_id="g", strip_experience=True)
    assert sample.prompt_ids == plain.result().prompt_ids and sample.response_ids == []
    assert sample.exp_mask is True


# ------------------------------------------------------------------------------------------------ self_clip


@pytest.mark.parametrize("model", MODELS)
def test_self_clip_strips_every_sample_after_archiving(model: str) -> None:
    """Each sample's prompt is re-rendered from its own messages: after a clip that is the archive
    summary plus kept turns, still opening with the task, whose experience is stripped too."""
    steps = [Step(f"Step {k}: I try option {k}.", observations=[
        {"role": "user", "content": f"Option {k} failed with error code 17; try another."}]) for k in range(8)]
    cm = make(model, "self_clip", max_model_len=600, clip_threshold=0.6, keep_last_turns=1)
    run(model, cm, steps, EXPERIENCE)
    generated, stripped = cm.results(), cm.results(strip_experience=True)
    assert 1 <= cm.metrics()["clip_calls"] < len(steps) - 1 and len(stripped) >= 2
    for index, (gen, strip) in enumerate(zip(generated, stripped, strict=True)):
        start, end = gen.experience_span or (0, 0)
        assert end > start and strip.experience_stripped
        assert strip.prompt_ids == gen.prompt_ids[:start] + gen.prompt_ids[end:]
        text = decode(model, strip.prompt_ids)
        assert EXPERIENCE.strip() not in text and "Compute (2+2)*3." in text
        assert (FakeClipper.text in text) == (index > 0)
        assert response(strip) == response(gen)
        trained = [m for m in strip.messages if m.author is Author.LLM]
        assert len(trained) == strip.num_generations, "kept turns in a clipped prompt are history, not trained"
        expected = cm.renderer.render([m for m in strip.messages[: len(strip.messages) - _response_messages(strip)]])
        assert strip.prompt_ids == expected.ids


def _response_messages(result: ContextResult) -> int:
    """How many of a result's messages come after its prompt (the trained turn and what followed it)."""
    first_trained = next(i for i, m in enumerate(result.messages) if m.author is Author.LLM)
    return len(result.messages) - first_trained


# ------------------------------------------------------------------------------------------------ tricky text


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", REPLAYABLE)
@pytest.mark.parametrize("kind", sorted(TRICKY_EXPERIENCES))
def test_experience_that_looks_like_markup_or_repeats_the_task_strips_exactly(
    model: str, name: str, kind: str
) -> None:
    experience = TRICKY_EXPERIENCES[kind]
    with_exp, without = make(model, name), make(model, name)
    run(model, with_exp, EPISODE, experience)
    run(model, without, EPISODE, None)
    generated, stripped = with_exp.results(), with_exp.results(strip_experience=True)
    for gen, strip, ref in zip(generated, stripped, without.results(), strict=True):
        start, end = gen.experience_span or (0, 0)
        assert end > start and decode(model, gen.prompt_ids[start:end]) == experience
        assert strip.prompt_ids == ref.prompt_ids
        assert decode(model, strip.prompt_ids) == decode(model, ref.prompt_ids)
        assert response(strip) == response(gen)


# ------------------------------------------------------------------------------------------------ re-render is truth


def test_a_template_that_trims_contents_strips_by_re_rendering_not_by_cutting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a template that trims each content, the task's trailing blank is kept in the generation prompt
    (the experience follows it) but trimmed without the experience: cutting the span would leave a prompt
    no experience-free episode ever had. Re-rendering gives the right one; the mismatch is logged at DEBUG."""
    trimming = copy.deepcopy(tokenizer("tiny-test"))
    trimming.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    initial = [{"role": "user", "content": "Compute (2+2)*3.   "}]
    tok = tokenizer("tiny-test")
    managers = [make_context_manager("linear", trimming, {"max_model_len": 1024}) for _ in range(2)]
    for cm, experience in zip(managers, ("Use the calc tool.", None), strict=True):
        cm.start(initial, experience=experience)
        cm.add_generation([*tok.encode("12", add_special_tokens=False), tok.eos_token_id], step=0)
    with_exp, without = managers
    gen = with_exp.result()
    start, end = gen.experience_span or (0, 0)
    with caplog.at_level(logging.DEBUG, logger="agentevolver.module.context_manager.base"):
        strip = with_exp.result(strip_experience=True)
    assert strip.prompt_ids == without.result().prompt_ids
    assert strip.prompt_ids != gen.prompt_ids[:start] + gen.prompt_ids[end:]
    assert any("differs from the prompt with its experience span" in r.getMessage() for r in caplog.records)
    assert response(strip) == response(gen)
