"""The agent flow: whole episodes through a real environment service, token-exact.

The policy is the edge here: :class:`ScriptedPolicy` answers each generation with scripted text encoded by
the real ``tiny-test`` tokenizer (plus EOS), in verl's ``TokenOutput`` shape, so every episode outcome is
chosen by the test. Everything else is the product: the env service (a subprocess started by the real
command), the env client, context managers, parsers, tools, budgets and the verl agent-loop adapter. The
model-driven end-to-end runs are in tests/test_rollout_cli.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from env_service_fixture import env_service, quick_env_client
from hypothesis import given
from hypothesis import strategies as st
from scripted_openai_server import SCRIPTED_API_KEY_ENV, ScriptedOpenAIServer
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.workers.rollout.replica import TokenOutput

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClient
from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import (
    TERMINATIONS,
    AgentFlow,
    AgentFlowConfig,
    EpisodeResult,
    EpisodeSpec,
    RolloutDumpWriter,
    is_mad,
    read_rollout_dump,
    repeat_ratio,
    rollout_dump_path,
)
from agentevolver.module.agent_flow.runner import group_specs, run_episodes
from agentevolver.module.task_manager.store import original_objectives
from agentevolver.module.tools import ToolRegistry, ToolResult
from agentevolver.verl.agent_loop import AgentEvolverAgentLoop, episode_spec_from_row
from env_service.environments.calc.tasks import get_task


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


Reply = str | Callable[[str], str]


class ScriptedPolicy:
    """verl's ``generate`` signature; each call pops the next scripted reply (text or f(prompt_text))."""

    def __init__(self, replies: list[Reply], *, eos: bool = True, fail_at: int | None = None) -> None:
        self.replies = list(replies)
        self.eos = eos
        self.fail_at = fail_at
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        if self.fail_at is not None and len(self.calls) - 1 == self.fail_at:
            raise RuntimeError("rollout server went away")
        reply = self.replies.pop(0) if self.replies else "bye"
        text = reply(tokenizer().decode(prompt_ids)) if callable(reply) else reply
        ids = tokenizer().encode(text, add_special_tokens=False) + ([tokenizer().eos_token_id] if self.eos else [])
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.01 * (i + 1) for i in range(len(ids))],
                           stop_reason="completed")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("echo,echo_process,calc,codebox", tmp_path=tmp_path_factory.mktemp("flow")) as running:
        yield running.url


@pytest.fixture
async def env(service: str) -> Any:
    async with quick_env_client(service) as client:
        yield client


def live_instances(url: str) -> int:
    return httpx.get(f"{url}/stats").json()["data"]["live_instances"]


def make_flow(env: EnvClient, policy: ScriptedPolicy, *, max_model_len: int = 2048, registry: ToolRegistry | None = None,
              clipper: Any = None, max_response_len: int | None = None, **config: Any) -> AgentFlow:
    return AgentFlow(AgentFlowConfig.model_validate(config), tokenizer=tokenizer(), env_client=env,
                     generate=policy.generate, max_model_len=max_model_len, max_response_len=max_response_len,
                     tool_registry=registry if registry is not None else ToolRegistry(), clipper=clipper)


def spec(task_id: str = "t0", env_type: str = "echo", **fields: Any) -> EpisodeSpec:
    return EpisodeSpec(task_id=task_id, env_type=env_type, group_id=fields.pop("group_id", "g0"), **fields)


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


async def run_one(flow: AgentFlow, episode: EpisodeSpec | None = None) -> EpisodeResult:
    return await flow.run(episode or spec(), SAMPLING)


def check_invariants(result: EpisodeResult) -> None:
    """Alignment, masks, step ids and logprobs of every sample of an episode."""
    for sample in result.samples:
        n = len(sample.response_ids)
        assert len(sample.response_mask) == len(sample.step_ids) == n
        assert sample.response_logprobs is not None and len(sample.response_logprobs) == n
        for mask, step, logprob in zip(sample.response_mask, sample.step_ids, sample.response_logprobs, strict=True):
            assert (mask == 1) == (step >= 0)
            if mask == 0:
                assert logprob == 0.0
        policy_steps = [s for s in sample.step_ids if s >= 0]
        assert policy_steps == sorted(policy_steps)


# ----------------------------------------------------------------------------------------- stop tokens
@pytest.mark.parametrize(("parser", "stop_ids"), [
    ("hermes", None),  # declares none: the request carries no stop_token_ids
    ("kimi", [2]),  # <|im_end|>, id 2 in tiny-test's vocabulary
    ("gpt-oss", None),  # <|call|> is not one token of tiny-test's vocabulary: skipped, not sent as garbage
])
async def test_the_parsers_stop_tokens_reach_every_generation(env: EnvClient, parser: str,
                                                              stop_ids: list[int] | None) -> None:
    policy = ScriptedPolicy(["hello there", "bye"])
    await run_one(make_flow(env, policy, tools={"tool_parser": parser}))
    assert len(policy.calls) == 2
    assert all(call["params"].get("stop_token_ids") == stop_ids for call in policy.calls)


# ----------------------------------------------------------------------------------------- terminations
async def test_finished_episode_is_token_exact_and_renders_like_the_template(env: EnvClient, service: str) -> None:
    policy = ScriptedPolicy(["hello there", "bye"])
    result = await run_one(make_flow(env, policy))
    assert (result.termination, result.num_turns, result.reward.outcome, result.success) == ("finished", 2, 1.0, True)
    check_invariants(result)
    sample = result.final_sample
    eos = tokenizer().eos_token_id
    first, second = ([*tokenizer().encode(t, add_special_tokens=False), eos] for t in ("hello there", "bye"))
    assert sample.response_ids[: len(first)] == first and sample.response_ids[-len(second):] == second
    assert sample.response_logprobs[: len(first)] == pytest.approx([-0.01 * (i + 1) for i in range(len(first))])
    conversation = [{"role": "system", "content": "echo"}, {"role": "user", "content": "task t0"},
                    {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "echo: hello there"},
                    {"role": "assistant", "content": "bye"}]
    rendered = tokenizer().apply_chat_template(conversation, tokenize=False)
    assert tokenizer().decode(sample.prompt_ids + sample.response_ids) + "\n" == rendered
    # the first generation was asked for with the episode's request id, the budget and logprobs on
    assert len({call["request_id"] for call in policy.calls}) == 1
    assert policy.calls[0]["params"]["logprobs"] is True and policy.calls[0]["params"]["max_tokens"] == 1024
    assert [m["author"] for m in result.messages] == ["system", "env", "llm", "env", "llm", "env"]
    assert result.messages[-1]["content"] == "echo: bye" and result.messages[-1]["in_context"] is False
    assert live_instances(service) == 0


async def test_max_steps(env: EnvClient, service: str) -> None:
    result = await run_one(make_flow(env, ScriptedPolicy(["a", "b", "c", "d"]), max_steps=3))
    assert (result.termination, result.num_turns, result.reward.outcome) == ("max_steps", 3, 0.0)
    check_invariants(result)
    assert live_instances(service) == 0


async def test_response_budget_ends_the_episode_with_budget(env: EnvClient, service: str) -> None:
    """Seed 001 section 17: the response budget counts observations; the episode ends with 'budget'."""
    policy = ScriptedPolicy(["x " * 12] * 10)
    result = await run_one(make_flow(env, policy, max_model_len=400, max_response_len=60,
                                     context={"min_generation_tokens": 4}))
    assert result.termination == "budget"
    check_invariants(result)
    assert len(result.final_sample.response_ids) <= 60
    assert all(call["params"]["max_tokens"] <= 60 for call in policy.calls)
    assert live_instances(service) == 0


async def test_lost_instance_ends_with_env_error_and_is_recorded(env: EnvClient, service: str) -> None:
    result = await run_one(make_flow(env, ScriptedPolicy(["hello", "crash", "never"]), episode_retries=0),
                           spec(env_type="echo_process"))
    assert result.termination == "env_error" and result.error
    assert result.num_turns == 2 and result.reward.outcome == 0.0
    assert result.metrics["episode/env_errors"] == 1 and result.metrics["episode/restarts"] == 0
    assert result.failure == "env"
    check_invariants(result)
    assert live_instances(service) == 0


async def test_an_episode_whose_environment_failed_runs_again_from_its_start(env: EnvClient, service: str) -> None:
    """agent_flow.episode_retries: the lost attempt is dropped; the retry is a fresh episode on a new instance."""
    policy = ScriptedPolicy(["hello", "crash", "again", "bye"])
    result = await run_one(make_flow(env, policy, episode_retries=2, episode_retry_backoff_s=0.0),
                           spec(env_type="echo_process"))
    assert result.termination == "finished" and result.failure is None
    assert result.metrics["episode/restarts"] == 1
    assert result.num_turns == 2 and result.metrics.get("episode/env_errors", 0) == 0  # the kept attempt only
    assert len(policy.calls) == 4
    assert policy.calls[2]["prompt_ids"] == policy.calls[0]["prompt_ids"]  # the retry starts from the task again
    check_invariants(result)
    gave_up = await run_one(make_flow(env, ScriptedPolicy(["crash"] * 3), episode_retries=1, episode_retry_backoff_s=0.0),
                            spec(env_type="echo_process"))
    assert gave_up.termination == "env_error" and gave_up.metrics["episode/restarts"] == 1
    assert live_instances(service) == 0


async def test_an_episode_whose_evaluate_failed_runs_again_from_its_start(env: EnvClient, service: str) -> None:
    """An /evaluate that fails (the service died as the episode ended) leaves no reward to train on: the
    episode is an env failure and runs again, as one whose /step failed does."""
    gave_up = await run_one(make_flow(env, ScriptedPolicy(["bye-crash"]), episode_retries=0),
                            spec(env_type="echo_process"))
    assert gave_up.failure == "env" and gave_up.metrics["episode/evaluate_errors"] == 1
    assert gave_up.metrics["episode/restarts"] == 0 and gave_up.reward.outcome == 0.0
    policy = ScriptedPolicy(["bye-crash", "bye"])
    result = await run_one(make_flow(env, policy, episode_retries=1, episode_retry_backoff_s=0.0),
                           spec(env_type="echo_process"))
    assert result.failure is None and result.metrics["episode/restarts"] == 1
    assert result.reward.outcome == 1.0 and result.metrics.get("episode/evaluate_errors", 0) == 0
    check_invariants(result)
    assert live_instances(service) == 0


async def test_failed_create_is_an_env_error_episode_without_samples(env: EnvClient) -> None:
    result = await run_one(make_flow(env, ScriptedPolicy([]), episode_retries=0), spec(task_id="no-such-task"))
    assert result.termination == "env_error" and "no-such-task" in result.error
    assert result.samples == [] and result.num_turns == 0 and result.failure == "env"


async def test_generation_failure_is_data_and_the_instance_is_released(env: EnvClient, service: str) -> None:
    result = await run_one(make_flow(env, ScriptedPolicy(["hello"], fail_at=1)))
    assert result.termination == "error" and "rollout server went away" in result.error
    assert result.num_turns == 1
    check_invariants(result)
    assert live_instances(service) == 0


BROKEN_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": 2+}}</tool_call>'


async def test_malformed_calls_get_feedback_then_end_with_parse_error(env: EnvClient, service: str) -> None:
    """Seed 001 section 17.4: a broken call was an exception or silently 'no call'; now the model is told."""
    policy = ScriptedPolicy([BROKEN_CALL] * 5)
    result = await run_one(make_flow(env, policy, max_parse_errors=3))
    assert result.termination == "parse_error" and "invalid JSON" in result.error
    assert result.num_turns == 3 and result.metrics["episode/parse_errors"] == 3
    feedback = [m for m in result.messages if m["author"] == "env" and "malformed action" in m["content"]]
    assert len(feedback) == 2
    assert "episode/env_steps" not in result.metrics  # the environment never saw the broken turns
    assert live_instances(service) == 0


async def test_parse_error_terminate_and_env_modes(env: EnvClient) -> None:
    ended = await run_one(make_flow(env, ScriptedPolicy([BROKEN_CALL]), on_parse_error="terminate"))
    assert (ended.termination, ended.num_turns) == ("parse_error", 1)
    passed = await run_one(make_flow(env, ScriptedPolicy([BROKEN_CALL, "bye"]), on_parse_error="env"))
    assert passed.termination == "finished"
    assert any(m["content"].startswith("echo: <tool_call>") for m in passed.messages)


async def test_a_good_turn_resets_the_parse_error_count(env: EnvClient) -> None:
    replies = [BROKEN_CALL, BROKEN_CALL, "fine", BROKEN_CALL, BROKEN_CALL, "bye"]
    result = await run_one(make_flow(env, ScriptedPolicy(replies), max_parse_errors=3))
    assert result.termination == "finished" and result.metrics["episode/parse_errors"] == 4


LOOP = "la " * 80


async def test_madness_penalises_and_can_terminate(env: EnvClient) -> None:
    penalised = await run_one(make_flow(env, ScriptedPolicy([LOOP, "bye"])))
    assert penalised.termination == "finished"
    assert penalised.reward.madness == -1.0 and penalised.reward.outcome == -1.0
    assert penalised.metrics["episode/mad_steps"] == 1
    recorded = await run_one(make_flow(env, ScriptedPolicy([LOOP, "bye"]), madness={"penalize": False}))
    assert recorded.reward.madness == -1.0 and recorded.reward.outcome == 1.0
    stopped = await run_one(make_flow(env, ScriptedPolicy([LOOP, "bye"]), madness={"terminate": True}))
    assert (stopped.termination, stopped.num_turns) == ("madness", 1)
    off = await run_one(make_flow(env, ScriptedPolicy([LOOP, "bye"]), madness={"enable": False}))
    assert off.reward.madness == 0.0 and off.reward.outcome == 1.0


def test_repeat_ratio_hand_example() -> None:
    # bigrams of 1 2 1 2 1 2: (1,2) (2,1) (1,2) (2,1) (1,2) -> 2 distinct of 5
    assert repeat_ratio([1, 2, 1, 2, 1, 2], 2) == pytest.approx(1 - 2 / 5)
    assert repeat_ratio([1, 2, 3], 4) == 0.0
    assert not is_mad([7] * 10, ngram_size=2, min_tokens=11, max_repeat_ratio=0.5)
    assert is_mad([7] * 11, ngram_size=2, min_tokens=11, max_repeat_ratio=0.5)


@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 6))
def test_repeat_ratio_is_a_share(ids: list[int], n: int) -> None:
    assert 0.0 <= repeat_ratio(ids, n) < 1.0


# ----------------------------------------------------------------------------------------- tools
def local_tools(rewards: dict[str, float] | None = None) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.function
    def lookup(key: str) -> ToolResult:
        """Look a key up.

        Args:
            key: The key to look up.
        """
        return ToolResult(text=f"value of {key} is 42", reward=(rewards or {}).get(key, 0.0), metrics={"hits": 1})

    return registry


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


async def test_local_tool_calls_run_locally_and_their_schemas_are_in_the_prompt(env: EnvClient) -> None:
    """Seed 001 section 20: 'the model never calls tools' - the rendered prompt lists the schemas."""
    policy = ScriptedPolicy([call("lookup", key="a"), "bye"])
    result = await run_one(make_flow(env, policy, registry=local_tools()))
    assert result.termination == "finished"
    first_prompt = tokenizer().decode(policy.calls[0]["prompt_ids"])
    assert '"name": "lookup"' in first_prompt and "<tools>" in first_prompt
    tool_messages = [m for m in result.messages if m["role"] == "tool"]
    assert tool_messages == [{**tool_messages[0], "content": "value of a is 42", "tool_call_id": "call_0_0"}]
    assert result.metrics["episode/env_steps"] == 1  # only "bye" reached the environment
    assert result.metrics["tool/calls"] == 1 and result.metrics["tool/ok"] == 1
    check_invariants(result)


@pytest.mark.parametrize(("mode", "outcome"), [("ignore", 1.0), ("sum", 1.75), ("last", 1.25)])
async def test_tool_rewards_enter_the_episode_reward_by_mode(env: EnvClient, mode: str, outcome: float) -> None:
    """Seed 001 section 20: 'tool calls have a step reward but the training reward does not change'."""
    policy = ScriptedPolicy([call("lookup", key="a"), call("lookup", key="b"), "bye"])
    registry = local_tools({"a": 0.5, "b": 0.25})
    result = await run_one(make_flow(env, policy, registry=registry, tools={"tool_reward_mode": mode}))
    assert result.reward.outcome == pytest.approx(outcome)
    assert result.metrics["tool/reward_sum"] == 0.75


async def test_empty_tool_selection_means_no_tools(env: EnvClient) -> None:
    """Seed 001 section 15.2/20: tool_selection=[] showed every tool; now it hides them all."""
    policy = ScriptedPolicy([call("lookup", key="a"), "bye"])
    result = await run_one(make_flow(env, policy, registry=local_tools()), spec(tool_selection=[]))
    assert "<tools>" not in tokenizer().decode(policy.calls[0]["prompt_ids"])
    # not a local tool in this episode, so the call went to the environment (which echoes it)
    assert result.metrics.get("tool/calls", 0) == 0 and result.metrics["episode/env_steps"] == 2


async def test_unknown_tool_selection_is_a_config_error(env: EnvClient) -> None:
    with pytest.raises(ConfigError, match="nope"):
        await run_one(make_flow(env, ScriptedPolicy([]), registry=local_tools()), spec(tool_selection=["nope"]))


async def test_calls_beyond_max_parallel_calls_are_answered(env: EnvClient) -> None:
    policy = ScriptedPolicy([call("lookup", key="a") + call("lookup", key="b"), "bye"])
    result = await run_one(make_flow(env, policy, registry=local_tools(), tools={"max_parallel_calls": 1}))
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert tool_messages[0] == "value of a is 42" and "not run" in tool_messages[1]
    assert result.metrics["tool/error/not_executed"] == 1


async def test_a_local_tool_named_like_an_environment_tool_is_an_error(env: EnvClient) -> None:
    registry = ToolRegistry()

    @registry.function
    def calculator(expression: str) -> str:
        """Shadow the environment's calculator.

        Args:
            expression: Anything.
        """
        return expression

    with pytest.raises(ConfigError, match="calculator"):
        await run_one(make_flow(env, ScriptedPolicy([]), registry=registry), spec("train-single-000", "calc"))


async def test_environment_tools_solve_a_calc_task(env: EnvClient, service: str) -> None:
    task = get_task("train-single-000")
    answer = f"FINAL ANSWER: {task.answer:g}"
    policy = ScriptedPolicy([call("calculator", **task.solution["arguments"]), answer])
    result = await run_one(make_flow(env, policy), spec("train-single-000", "calc"))
    assert (result.termination, result.success, result.reward.outcome) == ("finished", True, 1.0)
    assert '"name": "calculator"' in tokenizer().decode(policy.calls[0]["prompt_ids"])
    tool_reply = next(m for m in result.messages if m["role"] == "tool" and m["step"] >= 0)
    assert tool_reply["tool_call_id"] == "call_0_0"
    check_invariants(result)
    assert live_instances(service) == 0


async def test_codebox_episode_submits_and_is_graded(env: EnvClient) -> None:
    from env_service.environments.codebox.examples import SOLVED_EXAMPLE

    def as_text(action: dict[str, Any]) -> str:
        if not action.get("tool_calls"):
            return action["content"]
        function = action["tool_calls"][0]["function"]
        arguments = function["arguments"]
        return call(function["name"], **(json.loads(arguments) if isinstance(arguments, str) else arguments))

    replies = [as_text(action) for action in SOLVED_EXAMPLE["actions"]]
    result = await run_one(make_flow(env, ScriptedPolicy(replies), max_model_len=4096),
                           spec(SOLVED_EXAMPLE["task_id"], "codebox"))
    assert result.termination == "finished"
    assert result.reward.outcome == SOLVED_EXAMPLE["expected_score"]


# ----------------------------------------------------------------------------------------- context managers
@pytest.mark.parametrize("template", ["linear", "linear_think", "memory"])
async def test_every_context_manager_keeps_the_invariants_in_a_real_episode(env: EnvClient, template: str) -> None:
    replies = ["<think>plan a</think>step one", "<think>plan b</think>step two", "bye"]
    result = await run_one(make_flow(env, ScriptedPolicy(replies), context_template=template))
    assert result.termination == "finished" and result.num_turns == 3
    check_invariants(result)
    trained = [t for s in result.samples for t, m in zip(s.response_ids, s.response_mask, strict=True) if m]
    assert len(trained) == result.metrics["episode/generated_tokens"]  # every generated token trained once


async def test_self_clip_episode_through_the_scripted_llm_server(
    env: EnvClient, scripted_llm: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SCRIPTED_API_KEY_ENV, "test-key")
    scripted_llm.respond_with(lambda body: "- the agent said many things")
    replies = [f"step {i} " + "word " * 20 for i in range(6)] + ["bye"]
    with LLMClient(scripted_llm.endpoint(), name="context_clipper") as clipper:
        flow = make_flow(env, ScriptedPolicy(replies), clipper=clipper, context_template="self_clip",
                         max_model_len=400, max_steps=10, context={"clip_threshold": 0.5})
        result = await run_one(flow)
    assert result.termination == "finished" and len(scripted_llm.requests) >= 1
    assert len(result.samples) >= 2
    check_invariants(result)


def test_self_clip_without_a_clipper_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="context_clipper"):
        AgentFlow(AgentFlowConfig(context_template="self_clip"), tokenizer=tokenizer(), env_client=None,  # type: ignore[arg-type]
                  generate=ScriptedPolicy([]).generate, max_model_len=512)


async def test_experience_and_synthetic_query_shape_the_prompt(env: EnvClient) -> None:
    policy = ScriptedPolicy(["bye"])
    episode = spec(query="say bye please", experience="\n\nTip: saying bye ends it.")
    result = await run_one(make_flow(env, policy), episode)
    prompt = tokenizer().decode(policy.calls[0]["prompt_ids"])
    assert "say bye please" in prompt and "task t0" not in prompt and "Tip: saying bye" in prompt
    sample = result.final_sample
    start, end = sample.extras["experience_span"]
    assert tokenizer().decode(sample.prompt_ids[start:end]) == "\n\nTip: saying bye ends it."
    assert sample.exp_mask is False  # kept: trained in the context it was generated in
    assert result.metrics["exp/injected"] == 1.0 and result.metrics["exp/stripped"] == 0.0


async def test_discarded_experience_is_stripped_from_the_trained_prompt(env: EnvClient) -> None:
    guided, plain = ScriptedPolicy(["bye"]), ScriptedPolicy(["bye"])
    stripped = await run_one(make_flow(env, guided), spec(
        query="say bye please", experience="\n\nTip: saying bye ends it.", train_mode="discard"))
    without = await run_one(make_flow(env, plain), spec(query="say bye please"))
    assert "Tip: saying bye" in tokenizer().decode(guided.calls[0]["prompt_ids"])  # generated with it
    sample, reference = stripped.final_sample, without.final_sample
    assert sample.prompt_ids == reference.prompt_ids  # trained without it, token for token
    assert sample.response_ids == reference.response_ids
    assert sample.exp_mask is True and stripped.metrics["exp/stripped"] == 1.0


# ----------------------------------------------------------------------------------------- many episodes, dumps
async def test_concurrent_groups_release_everything_and_keep_order(env: EnvClient, service: str) -> None:
    specs = group_specs(original_objectives([f"t{i}" for i in range(4)], "echo", "env"), n=3)
    flow = make_flow(env, ScriptedPolicy([]))  # every reply is "bye"
    results = await run_episodes(flow, specs, SAMPLING, concurrency=5)
    assert [(r.task_id, r.rollout_id) for r in results] == [(s.task_id, s.rollout_id) for s in specs]
    assert {r.group_id for r in results} == {"t0", "t1", "t2", "t3"}
    assert all(r.termination == "finished" for r in results)
    assert live_instances(service) == 0


async def test_rollout_dump_round_trip(env: EnvClient, tmp_path: Path) -> None:
    results = [await run_one(make_flow(env, ScriptedPolicy(["hello", "bye"]))),
               await run_one(make_flow(env, ScriptedPolicy([]), max_steps=1), spec(task_id="no-such-task"))]
    writer = RolloutDumpWriter(tmp_path / "rollouts")
    advantages = [[0.5] * len(results[0].final_sample.response_ids), None]
    path = writer.write(3, results, advantages)
    assert path == rollout_dump_path(tmp_path / "rollouts", 3) == tmp_path / "rollouts" / "step_3.jsonl"
    records = list(read_rollout_dump(path))
    assert [r["termination"] for r in records] == ["finished", "env_error"]
    first = records[0]
    assert first["step"] == 3 and first["task_id"] == "t0" and first["advantages"] == advantages[0]
    assert first["response_ids"] == results[0].final_sample.response_ids
    assert first["reward"]["outcome"] == 1.0 and first["messages"][2]["author"] == "llm"
    assert records[1]["prompt_ids"] == [] and records[1]["error"]
    # rewriting a step replaces it (a resumed run does not duplicate episodes), nothing temporary is left
    writer.write(3, results[:1])
    assert len(list(read_rollout_dump(path))) == 1
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["step_3.jsonl"]
    with pytest.raises(ValueError, match="advantage"):
        writer.write(4, results, advantages[:1])


def test_dump_reader_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "step_0.jsonl"
    path.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"step_0\.jsonl:2"):
        list(read_rollout_dump(path))


def test_terminations_are_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "agent_flow.md").read_text()
    for name in TERMINATIONS:
        assert f"`{name}`" in doc


# ----------------------------------------------------------------------------------------- verl agent loop
async def test_verl_agent_loop_runs_the_episode(service: str) -> None:
    cfg = compose_config([f"env_service.env_url={service}", "data.max_prompt_length=256",
                          "actor_rollout_ref.rollout.response_length=128"])

    class ServerManager:
        generate = ScriptedPolicy(["hello", "bye"]).generate

    loop = AgentEvolverAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=ServerManager(),
                                 tokenizer=tokenizer(), processor=None, dataset_cls=None,
                                 data_config=DictConfigWrap(cfg.data))
    again = AgentEvolverAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=loop.server_manager,
                                  tokenizer=loop.tokenizer, processor=None, dataset_cls=None,
                                  data_config=DictConfigWrap(cfg.data))
    assert again.context is loop.context  # verl builds a loop per sample; the flow is built once per process
    out = await loop.run(dict(SAMPLING, logprobs=True), task=original_objectives(["t1"], "echo", "env")[0],
                         uid="u7")
    assert out.reward_score == 1.0 and out.num_turns == 2
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    assert out.extra_fields["termination"] == "finished" and out.extra_fields["group_id"] == "u7"
    # step ids: one int32 row padded to rollout.response_length with -1 (agent_loop.padded_step_ids)
    step_ids = out.extra_fields["step_ids"]
    assert step_ids.shape == (128,) and str(step_ids.dtype) == "int32"
    assert step_ids[: len(out.response_ids)].tolist() == out.extra_fields["episode_record"]["step_ids"]
    assert (step_ids[len(out.response_ids):] == -1).all()
    assert out.extra_fields["other_samples"] == []  # linear: one sample per episode
    assert out.extra_fields["episode_record"]["response_ids"] == out.response_ids
    failed = await loop.run(dict(SAMPLING, logprobs=True), task=original_objectives(["nope"], "echo", "env")[0],
                            uid="u8")
    assert failed.response_ids == [] and failed.reward_score == 0.0 and len(failed.prompt_ids) == 1
    assert failed.extra_fields["termination"] == "env_error"


def test_episode_spec_from_row_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="'task' field"):
        episode_spec_from_row({"uid": "x"})
    with pytest.raises(ConfigError, match=r"'task' field holding a TaskObjective.*got str"):
        episode_spec_from_row({"task": json.dumps({"task_id": "a", "env_type": "echo"}), "uid": "x"})
    (objective,) = original_objectives(["a"], "echo", "env")
    built = episode_spec_from_row({"task": objective, "uid": "u", "rollout_id": 2, "env_params": {"level": 1}})
    assert (built.group_id, built.rollout_id, built.env_params) == ("u", 2, {"level": 1})
    assert built.task is objective.task


def test_the_experience_plan_reaches_the_episode_under_one_name() -> None:
    """The experience manager's row columns are the EpisodeSpec fields they become, with the same types."""
    import numpy as np

    from agentevolver.module.exp_manager.manager import PLAN_COLUMNS

    assert set(PLAN_COLUMNS) <= set(EpisodeSpec.model_fields)
    row = {"task": original_objectives(["a"], "echo", "env")[0], "uid": "u", "add_experience": np.bool_(True),
           "train_mode": "discard"}
    built = episode_spec_from_row(row)
    assert (built.add_experience, built.train_mode) == (True, "discard")
    with pytest.raises(ValueError, match="train_mode"):
        episode_spec_from_row({**row, "train_mode": "drop"})


def test_yaml_section_equals_the_model_defaults() -> None:
    from omegaconf import OmegaConf

    section = OmegaConf.to_container(compose_config().agent_flow, resolve=True)
    assert AgentFlowConfig.model_validate(section) == AgentFlowConfig()


def test_run_episodes_rejects_bad_counts() -> None:
    with pytest.raises(ValueError, match="n"):
        group_specs(original_objectives(["a"], "echo", "env"), 0)
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(run_episodes(None, [], SAMPLING, concurrency=0))  # type: ignore[arg-type]
