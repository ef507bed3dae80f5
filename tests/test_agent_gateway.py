"""The agent gateway: programs written with the OpenAI SDK, their calls recorded token for token.

The policy is the edge here (:class:`ScriptedPolicy`: scripted replies encoded by the real ``tiny-test``
tokenizer, in verl's ``TokenOutput`` shape), so each test chooses what the model says. Everything else is
the product: the gateway served by uvicorn on the test's event loop, the real ``openai`` SDK in the
programs (in threads, as a plain-function program runs), the calc environment service started by its real
command, the context managers that fold calls into samples. Training through ``main_ppo`` with a real model
is tests/test_agent_gateway_training.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
from env_service_fixture import env_service, quick_env_client
from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

from agentevolver.client.env_client import EnvClient
from agentevolver.config.agent_program import AgentProgramConfig
from agentevolver.errors import ConfigError
from agentevolver.gateway.program import load_callable
from agentevolver.gateway.runner import ProgramEpisodes
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import AgentFlowConfig, EpisodeResult, EpisodeSpec
from agentevolver.module.exp_manager.retriever import Retrieval
from agentevolver.schema.message import ChatMessage
from agentevolver.verl.agent_loop import to_agent_loop_output

REPO_ROOT = Path(__file__).resolve().parent.parent
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


class ScriptedPolicy:
    """verl's ``generate``: each call pops the next scripted reply (text, or f(prompt text))."""

    def __init__(self, replies: list[str | Callable[[str], str]] | None = None, *, default: str = "FINAL ANSWER: 1",
                 delay_s: float = 0.0) -> None:
        self.replies = list(replies or [])
        self.default = default
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        self.calls.append({"request_id": request_id, "prompt_ids": list(prompt_ids), "params": dict(sampling_params)})
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        reply = self.replies.pop(0) if self.replies else self.default
        text = reply(tokenizer().decode(prompt_ids)) if callable(reply) else reply
        ids = [*tokenizer().encode(text, add_special_tokens=False), tokenizer().eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.01 * (i + 1) for i in range(len(ids))], stop_reason="completed")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc", tmp_path=tmp_path_factory.mktemp("gateway")) as running:
        yield running.url


@pytest.fixture
async def env(service: str) -> Any:
    async with quick_env_client(service) as client:
        yield client


def episodes(env: EnvClient, policy: ScriptedPolicy, *, max_model_len: int = 4096, max_response_len: int = 1024,
             flow: dict[str, Any] | None = None, retriever: Any = None, **program: Any) -> ProgramEpisodes:
    return ProgramEpisodes(AgentProgramConfig.model_validate(program),
                           AgentFlowConfig.model_validate({"max_tokens_per_turn": 64, **(flow or {})}),
                           tokenizer=tokenizer(), env_client=env, generate=policy.generate,
                           max_model_len=max_model_len, max_prompt_len=max_model_len - max_response_len - 1,
                           max_response_len=max_response_len, retriever=retriever)


def spec(task_id: str = "train-single-000", group_id: str = "g0", **fields: Any) -> EpisodeSpec:
    return EpisodeSpec(task_id=task_id, env_type="calc", group_id=group_id, **fields)


#: The programs below are this module's functions, loaded by the gateway as users give theirs.
THIS = __name__
OPENAI_AGENT = REPO_ROOT / "examples" / "agent_program" / "calc_agent.py"


def check_invariants(result: EpisodeResult) -> None:
    """Alignment, masks, step ids and log-probs of every sample (as for agent-flow episodes)."""
    for sample in result.samples:
        n = len(sample.response_ids)
        assert len(sample.response_mask) == len(sample.step_ids) == n
        assert sample.response_logprobs is not None and len(sample.response_logprobs) == n
        for mask, step, logprob in zip(sample.response_mask, sample.step_ids, sample.response_logprobs, strict=True):
            assert (mask == 1) == (step >= 0)
            if mask == 0:
                assert logprob == 0.0


# ----------------------------------------------------------------------------------------- programs
def two_calls_extending(task: Any) -> float:
    """A tool call, its result, then the answer: the second call extends the first."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.query}]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools,
                                           extra_body={"return_token_ids": True})
    message = first.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "42"})
    second = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools,
                                            extra_body={"return_token_ids": True})
    RECORDED[task.episode_id] = [first.model_dump(), second.model_dump()]
    return 1.0 if "42" in (second.choices[0].message.content or "") else 0.0


def edited_history(task: Any) -> dict[str, Any]:
    """Two calls where the second drops the first reply (a rewritten history): two samples."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "first question"}])
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "another question"}])
    return {"reward": 0.5, "success": True}


RECORDED: dict[str, Any] = {}


def raises(task: Any) -> float:
    from openai import OpenAI

    OpenAI(base_url=task.base_url, api_key=task.api_key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    raise RuntimeError("the agent's own bug")


def hangs(task: Any) -> float:
    time.sleep(30)
    return 1.0


async def hangs_async(task: Any) -> float:
    await asyncio.sleep(30)
    return 1.0


def nan_reward(task: Any) -> float:
    from openai import OpenAI

    OpenAI(base_url=task.base_url, api_key=task.api_key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    return float("nan")


def text_reward(task: Any) -> str:
    from openai import OpenAI

    OpenAI(base_url=task.base_url, api_key=task.api_key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}])
    return "great"


def no_call(task: Any) -> float:
    return 1.0


def one_call_then_reports(task: Any) -> None:
    from openai import OpenAI

    OpenAI(base_url=task.base_url, api_key=task.api_key).chat.completions.create(
        model="m", messages=[{"role": "user", "content": task.query}])
    httpx.post(task.reward_url, json={"reward": 0.25}).raise_for_status()


def calls_until_refused(task: Any) -> float:
    """Keeps talking until the gateway refuses (a full context or too many calls), then lets it raise."""
    from openai import OpenAI

    client = OpenAI(base_url=task.base_url, api_key=task.api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.query}]
    while True:
        reply = client.chat.completions.create(model="m", messages=messages).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": "go on " * 20}]


def answers_with_exemplars(task: Any) -> float:
    from openai import OpenAI

    OpenAI(base_url=task.base_url, api_key=task.api_key).chat.completions.create(
        model="m", messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": task.query}])
    return 1.0


# ----------------------------------------------------------------------------------------- prefix merge
async def test_a_call_that_extends_the_last_one_is_the_same_sample_token_for_token(env: EnvClient) -> None:
    policy = ScriptedPolicy([CALL % "6 * 7", "FINAL ANSWER: 42"])
    source = episodes(env, policy, callable=f"{THIS}:two_calls_extending")
    result = await source.run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.reward.outcome) == ("finished", None, 1.0)
    assert len(result.samples) == 1 and result.num_turns == 2
    check_invariants(result)
    sample = result.final_sample
    first, second = policy.calls
    # the second prompt is the first prompt + the ids generated for it + the tool result's turn: no
    # re-tokenisation of what the model said, which the program echoed back as text
    assert second["prompt_ids"][: len(first["prompt_ids"])] == first["prompt_ids"]
    assert sample.prompt_ids == first["prompt_ids"]
    assert sample.prompt_ids + sample.response_ids[: len(second["prompt_ids"]) - len(sample.prompt_ids)] == second["prompt_ids"]
    replies = RECORDED[next(iter(k for k in RECORDED if RECORDED[k][1]["choices"][0]["token_ids"]
                                 and RECORDED[k][0]["prompt_token_ids"] == first["prompt_ids"]))]
    generated_1 = replies[0]["choices"][0]["token_ids"]
    generated_2 = replies[1]["choices"][0]["token_ids"]
    assert replies[1]["prompt_token_ids"] == second["prompt_ids"]
    assert sample.response_ids[: len(generated_1)] == generated_1 and sample.response_ids[-len(generated_2):] == generated_2
    ones = [i for i, m in enumerate(sample.response_mask) if m == 1]
    assert len(ones) == len(generated_1) + len(generated_2)
    assert sorted({s for s in sample.step_ids if s >= 0}) == [0, 1]  # ADCA's steps are the calls
    # the SDK saw a parsed tool call in the first reply, plain text in the second
    assert replies[0]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    assert replies[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert replies[1]["choices"][0]["message"]["content"] == "FINAL ANSWER: 42"
    assert replies[1]["model"] == "gpt-4o-mini"  # any model name is answered by the policy
    # the agent loop's output has the same shape as an agent-flow episode's
    output = to_agent_loop_output(result, tokenizer(), 1024)
    assert output.response_ids == sample.response_ids and output.extra_fields["other_samples"] == []
    assert output.extra_fields["reward_extra_info"]["failed"] == 0.0
    assert all(call["request_id"] == first["request_id"] for call in policy.calls)  # one server per episode


async def test_a_call_that_rewrites_history_starts_a_sample_of_its_own(env: EnvClient) -> None:
    policy = ScriptedPolicy(["one", "two"])
    result = await episodes(env, policy, callable=f"{THIS}:edited_history").run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.reward.outcome, result.success) == ("finished", None, 0.5, True)
    assert len(result.samples) == 2
    check_invariants(result)
    for sample, call in zip(result.samples, policy.calls, strict=True):
        assert sample.prompt_ids == call["prompt_ids"]
    assert next(s for s in result.samples[1].step_ids if s >= 0) == 1
    output = to_agent_loop_output(result, tokenizer(), 1024)
    assert len(output.extra_fields["other_samples"]) == 1  # the multi-sample path trains both


async def test_the_example_openai_agent_runs_and_the_environment_scores_its_answer(env: EnvClient) -> None:
    """examples/agent_program/calc_agent.py, unchanged: a calculator call, then the answer calc checks."""
    from env_service.environments.calc.tasks import get_task

    task = get_task("train-single-000")
    expression = task.solution["arguments"]["expression"]
    answer = f"{task.answer:g}"
    policy = ScriptedPolicy([CALL % expression, f"FINAL ANSWER: {answer}"])
    source = episodes(env, policy, callable=f"{OPENAI_AGENT}:run", reward="env")
    result = await source.run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.success) == ("finished", None, True), result.error
    assert len(result.samples) == 1 and result.num_turns == 2
    check_invariants(result)
    # the program sent the environment's opening (its demonstrations) as its first prompt
    assert task.query in tokenizer().decode(policy.calls[0]["prompt_ids"])
    tool_turn = tokenizer().decode(policy.calls[1]["prompt_ids"][len(policy.calls[0]["prompt_ids"]):])
    assert answer in tool_turn  # the local calculator's result was observed

    wrong = ScriptedPolicy(["FINAL ANSWER: -1"])
    result = await episodes(env, wrong, callable=f"{OPENAI_AGENT}:run", reward="env").run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.success, result.reward.outcome) == ("finished", None, False, 0.0)


# ----------------------------------------------------------------------------------------- faults
@pytest.mark.parametrize(("program", "fault", "timeout_s"), [
    ("raises", "raised", 300), ("hangs", "timeout", 0.5), ("hangs_async", "timeout", 0.5),
    ("nan_reward", "bad_reward", 300), ("text_reward", "bad_reward", 300), ("no_call", "no_call", 300),
])
async def test_a_faulty_program_fails_its_episode_alone(env: EnvClient, program: str, fault: str,
                                                        timeout_s: float) -> None:
    source = episodes(env, ScriptedPolicy(), callable=f"{THIS}:{program}", timeout_s=timeout_s)
    result = await source.run(spec(), SAMPLING)
    assert result.failure == "program" and result.termination == "error", result
    assert result.metrics["episode/program_failed"] == 1.0 and result.metrics[f"episode/program_{fault}"] == 1.0
    assert result.error and result.reward.outcome == 0.0
    output = to_agent_loop_output(result, tokenizer(), 1024)
    assert output.extra_fields["failure"] == "program"  # the trainer keeps it out of the update
    assert output.extra_fields["reward_extra_info"]["failed"] == 1.0  # validation's failed/mean@k counts it
    # the environment instance was released in every case
    info = httpx.get(f"{env.settings.env_url}/healthz").status_code
    assert info == 200
    # and the next episode of the same source is unaffected
    good = episodes(env, ScriptedPolicy(), callable=f"{THIS}:one_call_then_reports")
    assert (await good.run(spec(), SAMPLING)).failure is None


async def test_a_reward_reported_to_the_reward_url_scores_the_episode(env: EnvClient) -> None:
    result = await episodes(env, ScriptedPolicy(), callable=f"{THIS}:one_call_then_reports").run(spec(), SAMPLING)
    assert (result.failure, result.reward.outcome, result.success) == (None, 0.25, False)


async def test_a_program_stopped_by_the_budget_is_trained_like_an_episode_at_its_budget(env: EnvClient) -> None:
    policy = ScriptedPolicy(default="thinking " * 10)
    result = await episodes(env, policy, callable=f"{THIS}:calls_until_refused", max_model_len=700,
                            max_response_len=300).run(spec(), SAMPLING)
    assert (result.termination, result.failure) == ("budget", None), result.error
    assert result.metrics["episode/refused_calls"] == 1.0 and result.num_turns >= 2
    check_invariants(result)
    many = await episodes(env, ScriptedPolicy(default="ok"), callable=f"{THIS}:calls_until_refused",
                          flow={"max_steps": 3}).run(spec(), SAMPLING)
    assert (many.termination, many.failure, many.num_turns) == ("max_steps", None, 3)


async def test_a_command_program_gets_the_endpoint_and_reports_its_reward(env: EnvClient, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent('''
        import json, os
        from openai import OpenAI
        task = json.loads(os.environ["AGENTEVOLVER_TASK"])
        reply = OpenAI().chat.completions.create(model=os.environ["AGENTEVOLVER_MODEL"],
                                                 messages=[{"role": "user", "content": task["query"]}])
        print("answer:", reply.choices[0].message.content)
        print(json.dumps({"reward": 0.75}))
    '''))
    result = await episodes(env, ScriptedPolicy(), command=[sys.executable, str(script)]).run(spec(), SAMPLING)
    assert (result.failure, result.reward.outcome, result.num_turns) == (None, 0.75, 1), result.error
    bad = tmp_path / "bad.py"
    bad.write_text("import sys; print('boom'); sys.exit(3)\n")
    result = await episodes(env, ScriptedPolicy(), command=f"{sys.executable} {bad}").run(spec(), SAMPLING)
    assert result.failure == "program" and result.metrics["episode/program_exit_status"] == 1.0
    assert "status 3" in result.error and "boom" in result.error
    slow = tmp_path / "slow.py"
    slow.write_text("import time; time.sleep(60)\n")
    started = time.monotonic()
    result = await episodes(env, ScriptedPolicy(), command=[sys.executable, str(slow)], timeout_s=0.5).run(spec(), SAMPLING)
    assert result.failure == "program" and result.metrics["episode/program_timeout"] == 1.0
    assert time.monotonic() - started < 30  # killed at its limit, not waited for


# ----------------------------------------------------------------------------------------- concurrency
async def test_concurrent_episodes_each_get_their_own_endpoint_and_samples(env: EnvClient) -> None:
    policy = ScriptedPolicy([CALL % "6 * 7", "FINAL ANSWER: 42"] * 8, delay_s=0.05)
    source = episodes(env, policy, callable=f"{THIS}:two_calls_extending")
    # replies are popped in arrival order, so concurrent episodes may get each other's script: answer by prompt
    policy.replies = []
    policy.default = ""

    def by_prompt(text: str) -> str:
        return "FINAL ANSWER: 42" if "<tool_response>" in text else CALL % "6 * 7"

    policy.replies = [by_prompt] * 16
    specs = [spec(task_id=f"train-single-00{i}", group_id=f"g{i % 2}", rollout_id=i) for i in range(8)]
    results = await asyncio.gather(*(source.run(s, SAMPLING) for s in specs))
    assert [r.failure for r in results] == [None] * 8 and all(r.reward.outcome == 1.0 for r in results)
    assert all(len(r.samples) == 1 and r.num_turns == 2 for r in results)
    for result, episode_spec in zip(results, specs, strict=True):
        check_invariants(result)
        assert (result.task_id, result.rollout_id) == (episode_spec.task_id, episode_spec.rollout_id)
    assert len({call["request_id"] for call in policy.calls}) == 8


# ----------------------------------------------------------------------------------------- experience
class FixedRetriever:
    """The memory service's side (an edge): every group's experience is the same exemplar turns."""

    def __init__(self, turns: list[ChatMessage]) -> None:
        self.turns = turns
        self.asked: list[str] = []

    async def for_episode(self, group_id: str, messages: Any, task_id: str = "") -> Retrieval:
        self.asked.append(task_id)
        return Retrieval(experience=list(self.turns))


async def test_experience_goes_into_the_first_call_and_is_stripped_for_training(env: EnvClient) -> None:
    exemplar = [ChatMessage(role="user", content="What is 2 + 2?"), ChatMessage(role="assistant", content="FINAL ANSWER: 4")]
    plain = await episodes(env, (p0 := ScriptedPolicy()), callable=f"{THIS}:answers_with_exemplars").run(spec(), SAMPLING)
    retriever = FixedRetriever(exemplar)
    source = episodes(env, (p1 := ScriptedPolicy()), callable=f"{THIS}:answers_with_exemplars", retriever=retriever)
    kept = await source.run(spec(add_experience=True, train_mode="keep"), SAMPLING)
    stripped = await source.run(spec(add_experience=True, train_mode="discard"), SAMPLING)
    assert retriever.asked == ["train-single-000"] * 2
    assert "What is 2 + 2?" in tokenizer().decode(p1.calls[0]["prompt_ids"])
    assert "What is 2 + 2?" not in tokenizer().decode(p0.calls[0]["prompt_ids"])
    assert kept.metrics["exp/injected"] == 1.0 and kept.final_sample.prompt_ids == p1.calls[0]["prompt_ids"]
    assert stripped.metrics["exp/stripped"] == 1.0 and stripped.final_sample.exp_mask
    # trained without the exemplar turns: token for token the prompt of the episode without experience
    assert stripped.final_sample.prompt_ids == p0.calls[0]["prompt_ids"] == plain.final_sample.prompt_ids


# ----------------------------------------------------------------------------------------- the HTTP surface
async def test_bad_requests_unknown_and_finished_episodes_get_json_errors(env: EnvClient) -> None:
    source = episodes(env, ScriptedPolicy(), callable=f"{THIS}:no_call")
    url = await source.ensure_started()
    source.gateway.open("ep1", request_id="r", sampling_params=SAMPLING)
    base = f"{url}/episodes/ep1/v1/chat/completions"
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient() as client:
        cases = [({**good, "max_token": 5}, "max_token"), ({**good, "n": 2}, "n"), ({**good, "stop": ["x"]}, "stop"),
                 ({**good, "response_format": {"type": "json_object"}}, "response_format"),
                 ({**good, "logit_bias": {"1": 2}}, "logit_bias"), ({"model": "m", "messages": []}, "messages"),
                 ({**good, "return_token_ids": True, "stream": True}, "return_token_ids")]
        for body, field in cases:
            answer = await client.post(base, json=body)
            assert answer.status_code == 400, (field, answer.text)
            assert answer.json()["error"]["param"] == field and field in answer.json()["error"]["message"]
        assert "max_tokens" in (await client.post(base, json={**good, "max_token": 5})).json()["error"]["message"]
        not_json = await client.post(base, content=b"{", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and "error" in not_json.json()
        # accepted and answered: temperature is the run's (ignored), streaming is answered as events
        assert (await client.post(base, json={**good, "temperature": 0.0})).status_code == 200
        stream = await client.post(base, json={**good, "stream": True})
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        models = await client.get(f"{url}/episodes/ep1/v1/models")
        assert models.json()["data"][0]["id"] == "policy"
        bad_reward = await client.post(f"{url}/episodes/ep1/reward", json={"reward": "lots"})
        assert bad_reward.status_code == 400 and bad_reward.json()["error"]["param"] == "reward"

        unknown = await client.post(f"{url}/episodes/nope/v1/chat/completions", json=good)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "episode_not_found"
        await source.gateway.close("ep1")
        finished = await client.post(base, json=good)
        assert finished.status_code == 409 and finished.json()["error"]["code"] == "episode_finished"
        late = await client.post(f"{url}/episodes/ep1/reward", json={"reward": 1})
        assert late.status_code == 409
        counters = (await client.get(f"{url}/stats")).json()
        assert counters["opened"] == counters["closed"] == 1 and counters["open"] == 0
        assert counters["calls"] == 2  # the two answered; requests refused by validation never reach a call
    await source.server.stop()


def test_the_agent_loop_gets_the_program_source_from_the_registry_once_per_process() -> None:
    """The gateway registers its episode source itself (the verl plugin imports it where agent loops run), so
    the agent loop picks it by name and never imports the gateway; loop objects of one worker share it."""
    import ast

    import agentevolver.verl.agent_loop as agent_loop
    from agentevolver.config import compose_config

    tree = ast.parse(Path(agent_loop.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name and name.startswith("agentevolver.gateway") for name in imported)
    cfg = compose_config([f"agent_program.callable={THIS}:no_call"])
    policy = ScriptedPolicy()
    context = agent_loop.worker_context(cfg, policy, tokenizer())
    assert isinstance(context.episodes, ProgramEpisodes)
    assert agent_loop.worker_context(cfg, policy, tokenizer()) is context
    assert agent_loop.worker_context(cfg, ScriptedPolicy(), tokenizer()) is not context  # another server manager


def test_program_settings_are_checked_with_the_key_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent_program\.callable"):
        load_callable("no_such_module_xyz:run")
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_callable(f"{THIS}:missing")
    with pytest.raises(ConfigError, match="no file"):
        load_callable(f"{tmp_path / 'absent.py'}:run")
    with pytest.raises(ValueError, match="not both"):
        AgentProgramConfig(callable="a:b", command=["x"])
    with pytest.raises(ValueError, match=r"package\.module:function"):
        AgentProgramConfig(callable="just_a_module")
    assert AgentProgramConfig(command="python agent.py --fast").command == ["python", "agent.py", "--fast"]
    assert json.loads(AgentProgramConfig().model_dump_json())["reward"] == "program"


async def test_a_first_prompt_over_the_budget_ends_the_episode_at_its_budget_not_as_a_failure(env: EnvClient) -> None:
    policy = ScriptedPolicy()
    result = await episodes(env, policy, callable=f"{OPENAI_AGENT}:run", reward="env", max_model_len=300,
                            max_response_len=100).run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.samples, policy.calls) == ("budget", None, [], [])
    assert "context is full" in result.error and "data.max_prompt_length" in result.error


async def test_a_synthetic_tasks_question_reaches_the_program(env: EnvClient) -> None:
    """Self-Questioning's tasks carry their own question (``query``): the program is given it, as the agent
    flow puts it in place of the environment's question."""
    policy = ScriptedPolicy()
    source = episodes(env, policy, callable=f"{THIS}:answers_with_exemplars")
    result = await source.run(spec(query="How many minutes are in 7 hours?",
                                   metadata={"evaluator": "env", "synthetic": True}), SAMPLING)
    assert result.failure is None
    prompt = tokenizer().decode(policy.calls[0]["prompt_ids"])
    assert "How many minutes are in 7 hours?" in prompt
