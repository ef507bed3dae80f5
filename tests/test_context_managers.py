"""Context managers: conversations -> exact token sequences, loss masks, logprobs and step ids.

Everything runs on the real ``tiny-test`` tokenizer and its chat template. The expected token lists of the
worked example are built by hand from the tokenizer's encodings of the pieces (not from the code under
test); the other tests check the invariants every sample must satisfy and that prompt + response decodes to
the chat template's rendering of the conversation the sample holds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scripted_openai_server import SCRIPTED_API_KEY_ENV, ScriptedOpenAIServer
from transformers import AutoTokenizer

from agentevolver.client.llm_client import LLMClient
from agentevolver.errors import ConfigError, DuplicateNameError, UnknownNameError
from agentevolver.models import resolve_model_path
from agentevolver.module.context_manager import (
    SUMMARY_HEADER,
    Author,
    ContextManager,
    ContextManagerConfig,
    ContextOrderError,
    ContextResult,
    LinearContextManager,
    TemplateMismatchError,
    clip_text_to_tokens,
    context_manager_names,
    make_context_manager,
    register_context_manager,
    strip_think,
)
from agentevolver.module.context_manager.render import ContextRenderer, merge_joined
from agentevolver.module.tools import ToolResult
from agentevolver.schema.sample import Sample

ALL_MANAGERS = ("linear", "linear_think", "memory", "self_clip")

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]},
    },
}


@cache
def tokenizer() -> Any:
    """The real tiny-test tokenizer, loaded once per test process (hypothesis forbids function fixtures)."""
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


def enc(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def eos() -> int:
    return tokenizer().eos_token_id


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A hermes tool call exactly as the chat template lays out a structured call."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class FakeClipper:
    """The context_clipper role at the edge: records each request, answers a fixed summary (or fails)."""

    def __init__(self, text: str = "The agent computed sums; nothing else matters.", fail: bool = False) -> None:
        self.text, self.fail = text, fail
        self.calls: list[list[dict[str, str]]] = []

    def chat(self, messages: list[dict[str, str]], **_: Any) -> Any:
        self.calls.append(messages)
        if self.fail:
            raise RuntimeError("clipper down")

        @dataclass
        class Result:
            text: str

        return Result(self.text)


def make(name: str, llm: Any = None, tools: Sequence[dict[str, Any]] | None = None, **config: Any) -> ContextManager:
    if name == "self_clip" and llm is None:
        llm = FakeClipper()
    return make_context_manager(name, tokenizer(), ContextManagerConfig(**config), tools=tools, llm=llm)


@dataclass
class Step:
    """One scripted agent step: the assistant text, whether generation ended with EOS, the observations."""

    text: str
    eos: bool = True
    observations: list[dict[str, Any]] = field(default_factory=list)

    def ids(self) -> list[int]:
        return enc(self.text) + ([eos()] if self.eos else [])


def logprobs_for(ids: Sequence[int], step: int) -> list[float]:
    """Distinct, recognisable logprobs per step and position."""
    return [-(step + 1) - position / 1000 for position in range(len(ids))]


def run(cm: ContextManager, initial: list[dict[str, Any]], steps: Sequence[Step],
        experience: str | None = None, with_logprobs: bool = True) -> list[list[int]]:
    """Drive ``cm`` through ``steps`` like the agent flow; return the generated ids of each step."""
    cm.start(initial, experience=experience)
    generated = []
    for k, step in enumerate(steps):
        if cm.exhausted:
            break
        cm.next_prompt_ids()
        ids = step.ids()
        cm.add_generation(ids, logprobs_for(ids, k) if with_logprobs else None, step=k)
        generated.append(ids)
        cm.add_observation(step.observations)
    return generated


def closing(result: ContextResult) -> str:
    """What the template renders after the last generation: its closing of the assistant turn."""
    ended_with_eos = bool(result.response_ids) and result.response_ids[-1] == eos()
    return "\n" if ended_with_eos else "<|im_end|>\n"


def assert_invariants(result: ContextResult) -> None:
    """Alignment, mask/step/logprob consistency and Sample validation of one result."""
    n = len(result.response_ids)
    assert len(result.response_mask) == len(result.step_ids) == n
    assert result.response_logprobs is None or len(result.response_logprobs) == n
    for i, (mask, step) in enumerate(zip(result.response_mask, result.step_ids, strict=True)):
        assert mask in (0, 1)
        assert (mask == 1) == (step >= 0), f"token {i}: mask {mask} but step {step}"
        if mask == 0 and result.response_logprobs is not None:
            assert result.response_logprobs[i] == 0.0
    if n:
        assert result.response_mask[-1] == 1, "a sample's response ends with a policy token"
    sample = result.to_sample(task_id="t", group_id="g")
    assert isinstance(sample, Sample)


def policy_runs(result: ContextResult) -> list[list[int]]:
    """The maximal runs of mask-1 tokens, split where the step changes."""
    runs: list[list[int]] = []
    previous = None
    for token, mask, step in zip(result.response_ids, result.response_mask, result.step_ids, strict=True):
        if mask == 1:
            if step != previous:
                runs.append([])
            runs[-1].append(token)
        previous = step if mask == 1 else None
    return runs


def assert_renders_like_template(cm: ContextManager, result: ContextResult) -> None:
    """decode(prompt + response) == the template's rendering of the messages this sample holds."""
    decoded = tokenizer().decode(result.prompt_ids + result.response_ids, skip_special_tokens=False)
    if not result.response_ids:
        assert decoded == cm.renderer.plain_text(result.messages, add_generation_prompt=True)
        return
    assert result.messages[-1].author is Author.LLM
    rendered = cm.renderer.plain_text(result.messages, add_generation_prompt=False)
    assert decoded + closing(result) == rendered


# ------------------------------------------------------------------------------- seed 001, section 10


def test_seed_worked_example_p_a1_o_a2_exact_lists() -> None:
    """P, A1 (a tool call), O (its tool response), A2 -> the exact ids, mask, logprobs and step ids."""
    cm = make("linear", tools=[CALC_TOOL], max_env_len=None)
    system = "You are a calculator agent."
    prompt_ids = cm.start([{"role": "system", "content": system}, {"role": "user", "content": "What is 2+2?"}])

    tools_json = json.dumps(CALC_TOOL["function"])
    p_text = (
        f"<|im_start|>system\n{system}\n\n# Tools\n\nYou may call one or more of the functions below. Their JSON "
        f"schemas are listed between <tools> and </tools>:\n<tools>\n{tools_json}\n</tools>\n\nTo call a "
        "function, reply with one block per call, each holding a JSON object with the function name and its "
        'arguments:\n<tool_call>\n{"name": <function-name>, "arguments": <arguments-as-json-object>}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    P = enc(p_text)
    assert prompt_ids == P

    A1 = [*enc(tool_call_text("calc", {"expression": "2+2"})), eos()]
    A1_lp = [-0.2] * (len(A1) - 1) + [-0.1]
    cm.add_generation(A1, A1_lp, step=0)
    cm.add_observation([ToolResult(text="4", call_id="call_0_0", name="calc").to_message()])
    # The model emitted <|im_end|>, so the template's closing continues with "\n"; then the tool turn.
    obs = enc("\n") + enc("<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert cm.next_prompt_ids() == P + A1 + obs

    A2 = [*enc("The answer is 4."), eos()]
    A2_lp = [-0.3] * (len(A2) - 1) + [-0.05]
    cm.add_generation(A2, A2_lp, step=1)

    result = cm.result()
    assert result.prompt_ids == P
    assert result.response_ids == A1 + obs + A2
    assert result.response_mask == [1] * len(A1) + [0] * len(obs) + [1] * len(A2)
    assert result.response_logprobs == A1_lp + [0.0] * len(obs) + A2_lp
    assert result.step_ids == [0] * len(A1) + [-1] * len(obs) + [1] * len(A2)
    assert result.experience_span is None
    # The same conversation with a *structured* tool call renders to exactly the same text.
    conversation = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"expression": "2+2"}}}]},
        {"role": "tool", "content": "4", "tool_call_id": "call_0_0"},
        {"role": "assistant", "content": "The answer is 4."},
    ]
    rendered = tokenizer().apply_chat_template(conversation, tools=[CALC_TOOL], tokenize=False)
    assert tokenizer().decode(result.prompt_ids + result.response_ids) + "\n" == rendered
    assert [m.author for m in cm.messages] == [Author.SYSTEM, Author.ENV, Author.LLM, Author.ENV, Author.LLM]
    assert [m.trained for m in cm.messages] == [False, False, True, False, True]


def test_truncated_generation_gets_the_template_closing_as_observation_tokens() -> None:
    """A generation cut short (no EOS) is kept as is; the template's <|im_end|> is appended with mask 0."""
    cm = make("linear")
    P = cm.start([{"role": "user", "content": "Count."}])
    A1 = enc("one two thr")  # truncated mid-word, no EOS
    cm.add_generation(A1, [-0.5] * len(A1), step=0)
    cm.add_observation([{"role": "user", "content": "Go on."}])
    obs = enc("<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n")
    assert cm.next_prompt_ids() == P + A1 + obs
    A2 = [*enc("three"), eos()]
    cm.add_generation(A2, [-0.5] * len(A2), step=1)
    result = cm.result()
    assert result.response_ids == A1 + obs + A2
    assert result.response_mask == [1] * len(A1) + [0] * len(obs) + [1] * len(A2)
    assert_invariants(result)


def test_tokens_after_eos_are_dropped_and_logprobs_must_align() -> None:
    cm = make("linear")
    cm.start([{"role": "user", "content": "Hi"}])
    ids = [*enc("Hello"), eos(), *enc("garbage")]
    with pytest.raises(ValueError, match="logprobs"):
        cm.add_generation(ids, [-1.0])
    message = cm.add_generation(ids, [-1.0] * len(ids))
    assert message.generated_ids == (*enc("Hello"), eos())
    assert message.content == "Hello"
    assert cm.result().response_ids == [*enc("Hello"), eos()]
    assert cm.metrics()["tokens_after_eos"] == len(enc("garbage"))


def test_without_logprobs_the_sample_has_none_and_mixing_is_an_error() -> None:
    cm = make("linear")
    run(cm, [{"role": "user", "content": "Hi"}], [Step("a", observations=[{"role": "user", "content": "b"}]),
                                                  Step("c")], with_logprobs=False)
    assert cm.result().response_logprobs is None
    cm = make("linear")
    cm.start([{"role": "user", "content": "Hi"}])
    cm.add_generation(enc("a"), None)
    cm.add_observation([{"role": "user", "content": "b"}])
    with pytest.raises(ValueError, match="every generation"):
        cm.add_generation(enc("c"), [-1.0])


def test_calls_out_of_order_say_what_comes_next() -> None:
    cm = make("linear")
    with pytest.raises(ContextOrderError, match="start"):
        cm.next_prompt_ids()
    cm.start([{"role": "user", "content": "Hi"}])
    with pytest.raises(ContextOrderError, match="add_generation"):
        cm.add_observation([{"role": "user", "content": "x"}])
    cm.add_generation(enc("a"))
    with pytest.raises(ContextOrderError, match="add_observation"):
        cm.add_generation(enc("b"))
    bad = make("linear")
    bad.start([{"role": "user", "content": "Hi"}])
    with pytest.raises(ValueError, match="step"):
        bad.add_generation(enc("a"), step=-2)


# ------------------------------------------------------------------------------- every manager

INITIAL = [{"role": "system", "content": "You solve arithmetic with the calc tool."},
           {"role": "user", "content": "Compute (2+2)*3."}]
EXPERIENCE = "\n\nExperience from earlier attempts:\n<EXP>Use the calc tool for every operation.</EXP>\n\n"
EPISODE = [
    Step("<think>First add.</think>" + tool_call_text("calc", {"expression": "2+2"}),
         observations=[ToolResult(text="4", call_id="call_0_0", name="calc").to_message().model_dump()]),
    Step("<think>Now multiply, but I was cut", eos=False,
         observations=[{"role": "user", "content": "Your reply was cut off. Continue."}]),
    Step(tool_call_text("calc", {"expression": "4*3"}),
         observations=[ToolResult(text="12", call_id="call_2_0", name="calc").to_message().model_dump()]),
    Step("<think>Done.</think>The result is 12."),
]


@pytest.mark.parametrize("name", ALL_MANAGERS)
def test_every_manager_keeps_token_invariants_and_renders_like_the_template(name: str) -> None:
    """For every manager: aligned lists, mask 0 exactly off-policy, step ids match the mask, each generation
    trained exactly once with its real ids and logprobs, and each sample decodes to the template's rendering
    of what the model saw at its last turn."""
    cm = make(name, tools=[CALC_TOOL], max_model_len=4096)
    generated = run(cm, INITIAL, EPISODE, experience=EXPERIENCE)
    assert len(generated) == len(EPISODE) and not cm.exhausted
    results = cm.results()
    trained: list[list[int]] = []
    for result in results:
        assert_invariants(result)
        assert_renders_like_template(cm, result)
        trained += policy_runs(result)
        # the experience span is exact and strippable from every sample's prompt
        assert result.experience_span is not None
        start, end = result.experience_span
        assert tokenizer().decode(result.prompt_ids[start:end]) == EXPERIENCE
        stripped = result.prompt_ids[:start] + result.prompt_ids[end:]
        without = [m for m in result.messages if m.author is not Author.EXPERIENCE]
        expected = cm.renderer.plain_text(without, add_generation_prompt=False)
        assert tokenizer().decode(stripped + result.response_ids) + closing(result) == expected
    assert trained == generated, "every generation appears once, in order, with its exact ids"
    # logprobs of policy tokens are the rollout's, in order
    policy_lps = [lp for r in results for lp, m in zip(r.response_logprobs or [], r.response_mask, strict=True) if m]
    assert policy_lps == [lp for k, ids in enumerate(generated) for lp in logprobs_for(ids, k)]
    samples = cm.to_samples(task_id="task", group_id="group")
    assert len(samples) == len(results)
    assert all(s.extras["context_manager"] == name and s.extras["num_samples"] == len(results) for s in samples)
    authors = [m["author"] for m in samples[-1].extras["messages"]]
    assert authors[:3] == ["system", "env", "experience"]


def test_linear_is_one_sample_equal_to_the_full_rendering() -> None:
    cm = make("linear", tools=[CALC_TOOL])
    generated = run(cm, INITIAL, EPISODE)
    result = cm.result()
    conversation = [*INITIAL]
    for step in EPISODE:
        conversation.append({"role": "assistant", "content": step.text})
        conversation += step.observations
    conversation = conversation[: -len(EPISODE[-1].observations) or None]
    rendered = tokenizer().apply_chat_template(conversation, tools=[CALC_TOOL], tokenize=False)
    assert tokenizer().decode(result.prompt_ids + result.response_ids) + closing(result) == rendered
    assert sum(result.response_mask) == sum(len(ids) for ids in generated)


def test_linear_think_strips_history_thoughts_and_hints_only_the_last_message() -> None:
    hint = "\n\nThink first."
    cm = make("linear_think", tools=[CALC_TOOL], think_hint=hint)
    run(cm, INITIAL, EPISODE)
    results = cm.results()
    assert len(results) == len(EPISODE), "history is rewritten every turn: one sample per generation"
    for k, result in enumerate(results):
        prompt_text = tokenizer().decode(result.prompt_ids)
        last_turn = prompt_text.rsplit("<|im_start|>", 2)[-2]
        assert prompt_text.count(hint) == 1 and hint in last_turn, "the hint is on the last message only"
        assert "<think>" not in prompt_text, "history thoughts are stripped"
        assert policy_runs(result) == [EPISODE[k].ids()]
        history = [m for m in result.messages[:-1] if m.role == "assistant"]
        assert all(m.author is Author.LLM_DO_NOT_TRAIN and not m.trained for m in history)
        assert result.messages[-1].author is Author.LLM
    # the stripped form of a cut-off thought is empty
    assert strip_think("<think>Now multiply, but I was cut") == ""
    # the episode record keeps the original text
    assert cm.messages[2].content.startswith("<think>First add.</think>")


def test_linear_think_without_thoughts_or_hint_is_linear() -> None:
    steps = [Step("a", observations=[{"role": "user", "content": "b"}]), Step("c")]
    think = make("linear_think", think_hint="")
    linear = make("linear")
    run(think, [{"role": "user", "content": "Hi"}], steps)
    run(linear, [{"role": "user", "content": "Hi"}], steps)
    a, b = think.result(), linear.result()
    assert (a.prompt_ids, a.response_ids, a.response_mask, a.response_logprobs, a.step_ids) == (
        b.prompt_ids, b.response_ids, b.response_mask, b.response_logprobs, b.step_ids)


def test_memory_keeps_a_four_section_markdown_memory() -> None:
    cm = make("memory", tools=[CALC_TOOL])
    run(cm, INITIAL, EPISODE)
    results = cm.results()
    assert len(results) == len(EPISODE)
    last_prompt = tokenizer().decode(results[-1].prompt_ids)
    for section in ("## Earlier steps", "## Last action (step 2)", "## Last observation", "## Next"):
        assert section in last_prompt
    assert "[calc result] 12" in last_prompt and "<tool_call>" in last_prompt
    assert "<think>" not in last_prompt
    memory = [m for m in results[-1].messages if m.author is Author.MEMORY]
    assert len(memory) == 1 and not memory[0].trained
    # the prompt does not grow with every full observation: earlier steps are one line each
    assert last_prompt.count("- Step") == 2


# ------------------------------------------------------------------------------- budgets and clipping


def test_long_observation_is_clipped_to_max_env_len_tokens_with_a_marker() -> None:
    """Seed 001 section 20: a character cap is not a token cap; the clip here counts tokens."""
    cm = make("linear", max_env_len=40)
    cm.start([{"role": "user", "content": "Read the file."}])
    cm.add_generation([*enc("cat file"), eos()])
    long_text = "".join(f"line {i}: {'x' * (i % 7)} value={i * 37}\n" for i in range(300))
    cm.add_observation([{"role": "tool", "content": long_text, "name": "shell"}])
    obs = cm.messages[-1]
    assert obs.tokens_removed > 0 and len(enc(obs.content)) <= 40
    assert obs.content.endswith(f"\n...[{obs.tokens_removed} tokens truncated]")
    assert long_text.startswith(obs.content.split("\n...[")[0])
    assert obs.to_dict()["tokens_removed"] == obs.tokens_removed
    assert obs.content in tokenizer().decode(cm.next_prompt_ids())
    assert cm.metrics()["clipped_observations"] == 1


@settings(max_examples=40, deadline=None)
@given(text=st.text(min_size=0, max_size=400), limit=st.integers(min_value=1, max_value=60))
def test_clip_text_to_tokens_never_exceeds_the_limit(text: str, limit: int) -> None:
    renderer = ContextRenderer(tokenizer())
    clipped, removed = clip_text_to_tokens(text, limit, renderer, "\n...[{n} tokens truncated]")
    assert len(enc(clipped)) <= limit
    if removed == 0:
        assert clipped == text
    else:
        head = clipped.split("\n...[")[0] if "\n...[" in clipped else clipped
        assert text.startswith(head)


def test_window_budget_exhaustion_stops_before_the_observation() -> None:
    """Seed 001 section 17.1/20: an observation that would fill the window is not appended; the manager
    says so (exhausted, reason "window") instead of silently ending, and records the observation."""
    cm = make("linear", max_model_len=80, max_env_len=None)
    cm.start([{"role": "user", "content": "Go."}])
    steps = 0
    while not cm.exhausted:
        assert cm.remaining_budget() > 0
        cm.add_generation([*enc("next"), eos()], step=steps)
        cm.add_observation([{"role": "user", "content": "ok " * 6}])
        steps += 1
    assert cm.exhausted_reason == "window"
    assert cm.remaining_budget() == 0
    assert cm.messages[-1].in_context is False and cm.messages[-1].to_dict()["in_context"] is False
    with pytest.raises(ContextOrderError, match="budget"):
        cm.next_prompt_ids()
    result = cm.result()
    assert len(result.prompt_ids) + len(result.response_ids) <= 80
    assert_invariants(result)
    assert result.num_generations == steps


def test_response_budget_counts_observation_tokens() -> None:
    """Seed 001 section 17.2: the response budget is generated AND observation tokens."""
    cm = make("linear", max_model_len=4096, max_response_len=40, max_env_len=None)
    cm.start([{"role": "user", "content": "Go."}])
    cm.add_generation([*enc("a"), eos()])
    cm.add_observation([{"role": "user", "content": "word " * 10}])
    used = len(cm.next_prompt_ids()) - len(cm.result().prompt_ids)
    assert used > 2 and cm.remaining_budget() == 40 - used
    cm.add_generation([*enc("b"), eos()])
    cm.add_observation([{"role": "user", "content": "word " * 30}])
    assert cm.exhausted and cm.exhausted_reason == "response"
    assert len(cm.result().response_ids) <= 40


def test_generation_longer_than_the_budget_is_cut_and_exhausts() -> None:
    cm = make("linear", max_model_len=30)
    prompt = cm.start([{"role": "user", "content": "Go."}])
    room = cm.remaining_budget()
    assert room == 30 - len(prompt)
    ids = enc("word " * 40)
    cm.add_generation(ids, [-1.0] * len(ids))
    assert cm.exhausted and cm.exhausted_reason == "window"
    assert cm.result().response_ids == ids[:room]
    cm.add_observation([{"role": "user", "content": "late"}])  # recorded, never in context
    assert cm.messages[-1].in_context is False


def test_initial_prompt_over_the_prompt_cap_is_exhausted_at_start() -> None:
    cm = make("linear", max_model_len=4096, max_prompt_len=10)
    cm.start([{"role": "user", "content": "This task description is far longer than ten tokens."}])
    assert cm.exhausted and cm.exhausted_reason == "prompt"
    result = cm.result()
    assert result.response_ids == [] and result.num_generations == 0
    assert_renders_like_template(cm, result)


# ------------------------------------------------------------------------------- self_clip


def _clip_episode(n: int) -> list[Step]:
    return [Step(f"Step {k}: I try option {k}.", observations=[{"role": "user", "content": f"Option {k} "
                                                                "failed with error code 17; try another."}])
            for k in range(n)]


def test_self_clip_calls_the_clipper_exactly_when_the_threshold_is_crossed() -> None:
    config = {"max_model_len": 400, "clip_threshold": 0.5, "keep_last_turns": 1}
    clipper = FakeClipper()
    cm = make("self_clip", llm=clipper, **config)
    shadow = make("linear", **config)  # what the context would be without clipping
    cm.start(INITIAL)
    shadow.start(INITIAL)
    crossed_at = None
    for k, step in enumerate(_clip_episode(6)):
        for manager in (cm, shadow):
            manager.add_generation(step.ids(), step=k)
            manager.add_observation(step.observations)
        over = len(shadow.next_prompt_ids()) > 0.5 * 400
        if crossed_at is None:
            assert len(clipper.calls) == (1 if over else 0), f"step {k}: clipper called {len(clipper.calls)}x"
            if over:
                crossed_at = k
                break
    assert crossed_at is not None and crossed_at > 0
    # the archive prompt holds the task and the archived steps, not the kept last turn
    request = clipper.calls[0][-1]["content"]
    assert "Compute (2+2)*3." in request and "Step 0: I try option 0." in request
    assert f"Step {crossed_at}: I try option {crossed_at}." not in request
    prompt_text = tokenizer().decode(cm.next_prompt_ids())
    assert SUMMARY_HEADER in prompt_text and clipper.text in prompt_text
    assert f"I try option {crossed_at}." in prompt_text and "I try option 0." not in prompt_text
    assert len(cm.next_prompt_ids()) < len(shadow.next_prompt_ids())


def test_self_clip_long_episode_trains_every_generation_once_across_samples() -> None:
    clipper = FakeClipper()
    cm = make("self_clip", llm=clipper, max_model_len=300, clip_threshold=0.6, keep_last_turns=1)
    generated = run(cm, INITIAL, _clip_episode(12))
    results = cm.results()
    assert len(clipper.calls) >= 2 and len(results) == len(clipper.calls) + 1
    assert [run_ for r in results for run_ in policy_runs(r)] == generated
    for result in results:
        assert_invariants(result)
        assert_renders_like_template(cm, result)
        assert len(result.prompt_ids) + len(result.response_ids) <= 300
    assert "Summary so far" in clipper.calls[1][-1]["content"], "later archives build on the last summary"
    assert cm.metrics()["clip_calls"] == len(clipper.calls)


def test_self_clip_falls_back_to_a_note_when_the_clipper_fails() -> None:
    cm = make("self_clip", llm=FakeClipper(fail=True), max_model_len=300, clip_threshold=0.5)
    run(cm, INITIAL, _clip_episode(6))
    assert cm.metrics()["clip_failures"] >= 1
    assert "earlier steps were removed to save context" in (cm.summary or "")


def test_self_clip_through_the_scripted_llm_server(
    scripted_llm: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCRIPTED_API_KEY_ENV, "test-key")
    scripted_llm.respond_with(lambda body: "- tried options 0..n, all failed with code 17")
    with LLMClient(scripted_llm.endpoint(), name="context_clipper") as client:
        cm = make("self_clip", llm=client, max_model_len=400, clip_threshold=0.5)
        run(cm, INITIAL, _clip_episode(6))
    assert len(scripted_llm.requests) == cm.metrics()["clip_calls"] >= 1
    body = scripted_llm.requests[0].body
    assert body["messages"][0]["role"] == "system" and "Step 0" in body["messages"][1]["content"]
    assert "all failed with code 17" in tokenizer().decode(cm.results()[-1].prompt_ids)


def test_self_clip_needs_an_llm() -> None:
    with pytest.raises(ConfigError, match="context_clipper"):
        make_context_manager("self_clip", tokenizer(), None)


# ------------------------------------------------------------------------------- registry, template checks


def test_registry_names_and_errors() -> None:
    assert set(ALL_MANAGERS) <= set(context_manager_names())
    with pytest.raises(UnknownNameError, match=r"agent_flow\.context_template: unknown context manager 'lineer'; "
                       r"registered: linear, linear_think, memory, self_clip"):
        make_context_manager("lineer", tokenizer())
    with pytest.raises(DuplicateNameError, match="already registered"):
        register_context_manager("linear")(type("Other", (LinearContextManager,), {}))
    assert register_context_manager("linear")(LinearContextManager) is LinearContextManager  # same class: no-op
    cm = make_context_manager("linear", tokenizer(), {"max_model_len": 128, "max_env_len": None})
    assert cm.config.max_model_len == 128
    with pytest.raises(ValueError, match="max_response_len"):
        ContextManagerConfig(max_model_len=100, max_response_len=100)


def test_a_template_that_does_not_close_turns_with_eos_is_refused() -> None:
    odd = copy.deepcopy(tokenizer())
    odd.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}</turn>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cm = make_context_manager("linear", odd)
    cm.start([{"role": "user", "content": "Hi"}])
    cm.add_generation([*enc("Hello"), eos()])
    with pytest.raises(TemplateMismatchError, match="eos"):
        cm.add_observation([{"role": "user", "content": "x"}])
    odd.chat_template = "{% for m in messages %}{{ m.role }}:{% endfor %}"
    with pytest.raises(TemplateMismatchError, match="dropped"):
        make_context_manager("linear", odd).start(
            [{"role": "user", "content": "Hi"}], experience="exp")


# ------------------------------------------------------------------------------- random conversations

_PIECES = [*"abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,:;!?'\"()[]{}<>/\\-_=+*\n\t",
           "é", "ß", "中", "文", "🙂", " the", " and", "\n\n", "<think>", "</think>"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=40).map("".join)
_OBSERVATION = st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]), "content": _TEXT})
_STEP = st.builds(Step, text=_TEXT, eos=st.booleans(), observations=st.lists(_OBSERVATION, min_size=1, max_size=2))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=_TEXT, steps=st.lists(_STEP, min_size=1, max_size=5), experience=st.none() | _TEXT.filter(bool))
def test_linear_random_conversations_round_trip(task: str, steps: list[Step], experience: str | None) -> None:
    """Random assistant texts (tokenised as the 'generated' ids, with or without EOS) and observations: the
    single sample holds every generated id once with mask 1, everything else mask 0, and decodes to the
    chat template's rendering of the same conversation."""
    cm = make("linear", max_model_len=100_000, max_env_len=None)
    initial = [{"role": "user", "content": task}]
    generated = run(cm, initial, steps, experience=experience)
    result = cm.result()
    assert_invariants(result)
    assert policy_runs(result) == [ids for ids in generated if ids]
    assert [t for t, m in zip(result.response_ids, result.response_mask, strict=True) if m] == [t for ids in generated for t in ids]
    # The sample ends at the last generated token: an empty (zero-token) generation adds nothing to train.
    last = max((k for k, ids in enumerate(generated) if ids), default=-1)
    conversation: list[dict[str, Any]] = [{"role": "user", "content": task + (experience or "")}]
    for step in steps[: last + 1]:
        conversation += [{"role": "assistant", "content": step.text}, *step.observations]
    decoded = tokenizer().decode(result.prompt_ids + result.response_ids)
    if last < 0:
        assert decoded == tokenizer().apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        return
    conversation = conversation[: -len(steps[last].observations)]
    rendered = tokenizer().apply_chat_template(conversation, tokenize=False)
    assert decoded + closing(result) == rendered
    # Stronger, where re-encoding the generated text is canonical (no leading whitespace merging into the
    # header's newline; no experience span, which is tokenised alone on purpose): the sequence IS the
    # tokenisation of the rendering, so each observation chunk tokenised alone equals its ids in context.
    if experience is None and not any(step.text[:1].isspace() for step in steps[: last + 1]):
        sequence = result.prompt_ids + result.response_ids
        assert enc(rendered)[: len(sequence)] == sequence
    assert [m["content"] for m in merge_joined(result.messages)] == [m["content"] for m in conversation]
