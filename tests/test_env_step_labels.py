"""Environment-grounded step labels: calc's rules, the ``/step_labels`` route, and ADCA with ``judge.source``.

calc labels hand-built episodes (stepped through the real environment, recorded as the agent flow records
them); the route runs in a real service process and is reached through ``EnvClient``; the ADCA stage runs
on a verl ``DataProto`` built from real agent-flow episodes (scripted policy at the edge) against that
service, and the LLM judge, where one is wanted, is the scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from env_service_fixture import env_service
from scripted_openai_server import ScriptedOpenAIServer
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.workers.rollout.replica import TokenOutput

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings
from agentevolver.config import compose_config, validate_config
from agentevolver.errors import ConfigError
from agentevolver.models import resolve_model_path
from agentevolver.module.adv_processor import AdcaHyper, AdcaStage, compute_prm_grpo_advantages
from agentevolver.module.adv_processor.env_labels import EnvStepLabeller
from agentevolver.module.agent_flow import AgentFlow, AgentFlowConfig, EpisodeSpec
from agentevolver.module.tools import ToolRegistry
from agentevolver.schema import ChatMessage, Task, TaskObjective
from agentevolver.schema.step_labels import split_steps
from agentevolver.verl.agent_loop import to_agent_loop_output
from env_service.base import CannotLabel
from env_service.environments.calc import CalcEnv
from env_service.environments.calc.tasks import CalcTask, get_task, split_task_ids

GOOD, BAD = "GOOD", "BAD"


def first_task(split: str, predicate: Any) -> CalcTask:
    """The first task of ``split`` whose reference expression satisfies ``predicate`` (robust to retuning)."""
    return next(get_task(t) for t in split_task_ids(split) if predicate(get_task(t).solution["arguments"]["expression"]))


#: "What is the value of A - B?": the shape of the failure seen in training ("65 - 59" -> "69 - 59").
SUB = first_task("train/single", lambda e: " - " in e)
#: "(A - B) * C" or "(A + B) * C": a chain whose first operation is an intermediate value.
CHAIN = first_task("train/chain", lambda e: e.startswith("("))


def operands(task: CalcTask) -> tuple[int, int]:
    a, b = task.solution["arguments"]["expression"].split(" - ")
    return int(a), int(b)


def n(value: float) -> str:
    return f"{value:g}"


def call(expression: str) -> str:
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "' + expression + '"}}\n</tool_call>'


def recorded(task: CalcTask, actions: list[str]) -> list[ChatMessage]:
    """The episode as the agent flow records it: the opening (system, calc's demonstration turns, the
    question) at step -1, then per step the assistant message and the environment's answer, tagged j."""
    env = CalcEnv(task.task_id, "labels-test", {})
    messages = [{**m.model_dump(exclude_none=True), "step": -1, "author": "env"} for m in env.reset()]
    for step, text in enumerate(actions):
        outcome = env.step(ChatMessage(role="assistant", content=text))
        messages.append({"role": "assistant", "content": text, "step": step, "author": "llm"})
        messages += [{**m.model_dump(exclude_none=True), "step": step, "author": "env"} for m in outcome.state]
        assert not outcome.is_terminated or step == len(actions) - 1, "an action after the episode ended"
    return [ChatMessage.model_validate(m) for m in messages]


def labels_of(task: CalcTask, actions: list[str]) -> list[tuple[str, str]]:
    return [(label.label, label.reason) for label in CalcEnv.label_steps(task.task_id, recorded(task, actions), {})]


# ----------------------------------------------------------------------------------------- calc's rules
def test_wrong_expression_correct_call_and_a_final_answer_that_ignores_the_tool_result() -> None:
    a, b = operands(SUB)
    labels = labels_of(SUB, [call(f"{a + 4} - {b}"), call(f"{a} - {b}"), f"FINAL ANSWER: {n(SUB.answer + 4)}"])
    assert [label for label, _ in labels] == [BAD, GOOD, BAD]
    assert f"{a + 4} - {b}" in labels[0][1] and "not a value the question asks for" in labels[0][1]
    assert "computes what the question needs" in labels[1][1]
    assert "contradicts the tool result" in labels[2][1]


@pytest.mark.parametrize(("case", "actions", "expected", "reason"), [
    ("call then correct answer", lambda a, b, r: [call(f"{a} - {b}"), f"FINAL ANSWER: {r}"], [GOOD, GOOD], "correct"),
    ("correct answer without a tool", lambda a, b, r: [f"FINAL ANSWER: {r}"], [GOOD], "correct"),
    ("reports a wrong calculation", lambda a, b, r: [call(f"{a} + {b}"), f"FINAL ANSWER: {a + b}"], [BAD, BAD],
     "result of a wrong calculation"),
    ("wrong answer, no tool", lambda a, b, r: [f"FINAL ANSWER: {a + b}"], [BAD], "no tool result"),
    ("the right value from numbers the question does not give",
     lambda a, b, r: [call(f"{int(r) + 1000} - 1000")], [BAD], "which the question does not give"),
    ("operands swapped", lambda a, b, r: [call(f"{b} - {a}")], [BAD], "not a value the question asks for"),
    ("commuted but equal", lambda a, b, r: [call(f"({a}) - {b}"), f"FINAL ANSWER: {r}"], [GOOD, GOOD], "correct"),
    ("a repeated call makes no progress",
     lambda a, b, r: [call(f"{a} - {b}"), call(f"{a} - {b}"), f"FINAL ANSWER: {r}"], [GOOD, BAD, GOOD], "correct"),
    ("a failing call", lambda a, b, r: [call(f"{a} -"), f"FINAL ANSWER: {r}"], [BAD, GOOD], "correct"),
    ("an unreadable call", lambda a, b, r: ['<tool_call>{"name": "calculator", "arguments": {"expression": 2+}}'
                                           "</tool_call>", f"FINAL ANSWER: {r}"], [BAD, GOOD], "correct"),
    ("text the environment nudges", lambda a, b, r: ["Let me think.", f"FINAL ANSWER: {r}"], [BAD, GOOD], "correct"),
    ("a final answer without a number", lambda a, b, r: ["FINAL ANSWER: I do not know"], [BAD], "without a number"),
    ("a call in the final message takes precedence",
     lambda a, b, r: [call(f"{a} - {b}") + f"\nFINAL ANSWER: {r}", f"FINAL ANSWER: {r}"], [GOOD, GOOD], "correct"),
])
def test_calc_label_rules(case: str, actions: Any, expected: list[str], reason: str) -> None:
    a, b = operands(SUB)
    labels = labels_of(SUB, actions(a, b, n(SUB.answer)))
    assert [label for label, _ in labels] == expected, labels
    assert reason in labels[-1][1], labels


def test_an_intermediate_value_of_a_chain_is_good() -> None:
    inner = re.match(r"\((.*)\) \* (\d+)", CHAIN.solution["arguments"]["expression"])
    assert inner is not None
    first, factor = inner.group(1), inner.group(2)
    from env_service.environments.calc.calculator import evaluate_expression

    partial = evaluate_expression(first)
    labels = labels_of(CHAIN, [call(first), call(f"{partial} * {factor}"), f"FINAL ANSWER: {n(CHAIN.answer)}"])
    assert [label for label, _ in labels] == [GOOD, GOOD, GOOD]
    # the whole chain in one call, or the intermediate written from the worked-out value, is fine too
    assert [label for label, _ in labels_of(CHAIN, [call(f"{partial} * {factor}")])] == [GOOD]


def test_every_tasks_reference_solution_is_good_and_a_wrong_answer_bad() -> None:
    """Every val and test task (120, every level, conversions with rounding included): the reference call and
    the correct answer are GOOD; the same call followed by a clearly different number is BAD."""
    for split in ("val", "test"):
        for task_id in split_task_ids(split):
            task = get_task(task_id)
            solution = "<tool_call>\n" + json.dumps(task.solution) + "\n</tool_call>"
            assert [x for x, _ in labels_of(task, [solution, f"FINAL ANSWER: {n(task.answer)}"])] == [GOOD, GOOD], task
            assert [x for x, _ in labels_of(task, [solution, f"FINAL ANSWER: {n(task.answer * 2 + 7)}"])] == [GOOD, BAD]


def test_a_distractor_number_is_bad() -> None:
    task = next(get_task(t) for t in split_task_ids("train/distractor") if "-year-old" in get_task(t).query)
    age = int(re.search(r"(\d+)-year-old", task.query).group(1))
    first = task.solution["arguments"]["expression"].split(" * ")[0]
    labels = labels_of(task, [call(f"{first} * {age}")])
    assert labels[0][0] == BAD and "not a value the question asks for" in labels[0][1]


def test_steps_are_agent_turns_whether_or_not_messages_carry_step_fields() -> None:
    """calc's opening holds 8 demonstration turns (assistant messages) before the question: never steps."""
    a, b = operands(SUB)
    actions = [call(f"{a + 4} - {b}"), call(f"{a} - {b}"), f"FINAL ANSWER: {n(SUB.answer)}"]
    tagged = recorded(SUB, actions)
    untagged = [ChatMessage.model_validate({k: v for k, v in m.model_dump().items() if k not in ("step", "author")})
                for m in tagged]
    assert len(split_steps(tagged).steps) == 3 and len(split_steps(tagged).context) == 34
    by_tags = CalcEnv.label_steps(SUB.task_id, tagged, {})
    by_order = CalcEnv.label_steps(SUB.task_id, untagged, {})
    assert [x.label for x in by_tags] == [x.label for x in by_order] == [BAD, GOOD, GOOD]
    assert [x.step for x in by_tags] == [0, 1, 2]


def test_calc_refuses_what_it_cannot_label() -> None:
    a, b = operands(SUB)
    episode = recorded(SUB, [call(f"{a} - {b}")])
    question = max(i for i, m in enumerate(episode) if m.role == "user")
    other = [m if i != question else m.model_copy(update={"content": "What is 2 + 2?"}) for i, m in enumerate(episode)]
    with pytest.raises(CannotLabel, match="do not hold the question") as err:
        CalcEnv.label_steps(SUB.task_id, other, {})
    assert err.value.field == "messages"
    broken = [*episode[:-1], episode[-1].model_copy(update={"step": "two"})]
    with pytest.raises(CannotLabel, match=rf"messages\.{len(episode) - 1}\.step must be an integer"):
        CalcEnv.label_steps(SUB.task_id, broken, {})


# ----------------------------------------------------------------------------------------- synthetic tasks
def played(seed: CalcTask, query: str, actions: list[str]) -> list[ChatMessage]:
    """An episode of a synthetic task played on ``seed``'s id: calc's opening with ``query`` in place of
    the seed's question, as the agent flow plays it."""
    episode = recorded(seed, actions)
    question = max(i for i, m in enumerate(episode) if m.role == "user" and seed.query in m.content)
    return [m if i != question else m.model_copy(update={"content": query}) for i, m in enumerate(episode)]


def test_a_synthetic_task_is_labelled_against_the_question_it_asked() -> None:
    query = "What is 39 * 13 - 8?"
    steps = [call("39 * 13"), call("507 - 8"), "FINAL ANSWER: 499"]
    labels = CalcEnv.label_steps(SUB.task_id, played(SUB, query, steps), {"task": {"query": query, "answer": "499"}})
    assert [x.label for x in labels] == [GOOD, GOOD, GOOD], labels  # 507 is the question's intermediate value
    wrong = [call("39 * 14"), call("39 * 13 - 8"), "FINAL ANSWER: 500"]
    labels = CalcEnv.label_steps(SUB.task_id, played(SUB, query, wrong), {"task": {"query": query, "answer": 499}})
    assert [x.label for x in labels] == [BAD, GOOD, BAD], labels
    assert "not a value the question asks for" in labels[0].reason and "contradicts" in labels[2].reason
    # a number the question does not give is BAD, as for calc's own tasks
    stray = CalcEnv.label_steps(SUB.task_id, played(SUB, query, [call("39 * 13 - 8 + 0 * 7")]),
                                {"task": {"query": query, "answer": "499"}})
    assert stray[0].label == BAD and "which the question does not give" in stray[0].reason
    # without the definition calc knows only its own question, and says how to send the other
    with pytest.raises(CannotLabel, match=r"params\.task"):
        CalcEnv.label_steps(SUB.task_id, played(SUB, query, steps), {})


def test_a_question_without_arithmetic_is_labelled_against_its_answer() -> None:
    query = "A baker makes 12 muffins a day. How many muffins does the baker make in 5 days?"
    definition = {"task": {"query": query, "answer": "60"}}
    steps = [call("12 + 5"), call("12 * 5"), "FINAL ANSWER: 60"]
    labels = CalcEnv.label_steps(SUB.task_id, played(SUB, query, steps), definition)
    assert [x.label for x in labels] == [BAD, GOOD, GOOD], labels


@pytest.mark.parametrize(("query", "answer", "expected"), [
    ("What is 39 * 13 - 8?", 499, "39 * 13 - 8"),
    ("Calculate 59 * 13 + 33 * 13.", 1196, "59 * 13 + 33 * 13"),
    ("What is 1,200 + 34?", 1234, "1200 + 34"),
    ("What is (4 + 6) * 3?", 30, "(4 + 6) * 3"),
    ("What is 7 * 8? Then add 2.", 56, "7 * 8"),  # the run whose value is the answer
    ("What is 7 * 8?", 57, None),
    ("How many meters are in 5 kilometers?", 5000, None),
])
def test_the_questions_arithmetic(query: str, answer: float, expected: str | None) -> None:
    from env_service.environments.calc.played_task import question_expression

    assert question_expression(query, answer, 1e-6) == expected


# ----------------------------------------------------------------------------------------- the service
@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc,echo", tmp_path=tmp_path_factory.mktemp("labels")) as running:
        yield running.url


@pytest.fixture
def client(service: str) -> Iterator[EnvClient]:
    with EnvClient(EnvClientSettings(env_url=service, max_retries=0)) as env:
        yield env


def test_labels_and_capabilities_through_the_service(client: EnvClient) -> None:
    assert client.capabilities("calc") == ["step_labels", "task_writing"] and client.capabilities("echo") == []
    a, b = operands(SUB)
    episode = recorded(SUB, [call(f"{a + 4} - {b}"), call(f"{a} - {b}"), f"FINAL ANSWER: {n(SUB.answer + 4)}"])
    data = client.step_labels("calc", SUB.task_id, episode)
    assert (data.env_type, data.task_id, data.flags) == ("calc", SUB.task_id, [False, True, False])
    assert [label.step for label in data.labels] == [0, 1, 2] and "contradicts" in data.labels[2].reason
    # plain dicts (a dump record's messages, with their extra fields) work the same
    assert client.step_labels("calc", SUB.task_id, [m.model_dump() for m in episode]).flags == data.flags


async def test_async_labels(service: str) -> None:
    async with EnvClient(EnvClientSettings(env_url=service, max_retries=0)) as env:
        assert await env.acapabilities("calc") == ["step_labels", "task_writing"]
        data = await env.astep_labels("calc", SUB.task_id, recorded(SUB, [f"FINAL ANSWER: {n(SUB.answer)}"]))
        assert data.flags == [True]


def test_an_environment_without_the_capability_answers_a_clear_error(client: EnvClient, service: str) -> None:
    with pytest.raises(EnvClientError) as err:
        client.step_labels("echo", "t1", [{"role": "user", "content": "task t1"}])
    assert (err.value.status, err.value.code, err.value.field) == (400, "capability_unsupported", "env_type")
    assert "'echo'" in str(err.value) and "'step_labels'" in str(err.value)
    raw = httpx.post(f"{service}/step_labels", json={"env_type": "echo", "task_id": "t1",
                                                     "messages": [{"role": "user", "content": "x"}]})
    assert raw.status_code == 400 and raw.json()["success"] is False and raw.json()["data"] is None


@pytest.mark.parametrize(("body", "status", "code", "field"), [
    ({"env_type": "calc", "messages": [{"role": "user", "content": "x"}]}, 422, "invalid_request", "task_id"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": []}, 422, "invalid_request", "messages"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": [{"role": "robot"}]}, 422, "invalid_request",
     "messages.0.role"),
    ({"env_type": "calc", "task_id": "no-such-task", "messages": [{"role": "user", "content": "x"}]}, 404,
     "unknown_task", "task_id"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": [{"role": "user", "content": "What is 2+2?"},
                                                                      {"role": "assistant", "content": "4"}]},
     422, "cannot_label", "messages"),
    ({"env_type": "nope", "task_id": "t", "messages": [{"role": "user", "content": "x"}]}, 404, "unknown_env",
     "env_type"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": [{"role": "user", "content": "x"}],
      "params": {"task": "What is 2+2?"}}, 400, "bad_request", "params.task"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": [{"role": "user", "content": "x"}],
      "params": {"task": {"answer": "4"}}}, 400, "bad_request", "params.task.query"),
    ({"env_type": "calc", "task_id": "train-single-000", "messages": [{"role": "user", "content": "x"}],
      "params": {"task": {"query": "x", "answer": "four"}}}, 400, "bad_request", "params.task.answer"),
])
def test_bad_requests_name_the_field(service: str, body: dict[str, Any], status: int, code: str, field: str) -> None:
    answer = httpx.post(f"{service}/step_labels", json=body)
    error = answer.json()["error"]
    assert (answer.status_code, error["field"]) == (status, field), error
    if code != "invalid_request":
        assert error["code"] == code


def test_existing_answers_are_unchanged(service: str) -> None:
    """The capability has routes of its own: what the reference's clients (and ours) read elsewhere keeps
    its shape (the reference's byte-level checks: tests/test_env_reference_compat.py)."""
    envs = httpx.get(f"{service}/envs").json()["data"]
    assert all(set(e) == {"env_type", "splits", "has_tools", "isolation"} for e in envs)
    created = httpx.post(f"{service}/create", json={"env_type": "calc", "task_id": SUB.task_id, "instance_id": None,
                                                    "messages": {}, "params": {}}).json()
    assert set(created) == {"success", "data"} and [m["role"] for m in created["data"]["state"]] == ["system", "user"]
    iid = created["data"]["info"]["instance_id"]
    httpx.post(f"{service}/release", json={"instance_id": iid})


# ----------------------------------------------------------------------------------------- the ADCA stage
@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


class ScriptedPolicy:
    """The policy at the edge: each call answers the next scripted text as tokens (verl's TokenOutput)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        ids = [*tokenizer().encode(self.replies.pop(0), add_special_tokens=False), tokenizer().eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed")


def episodes() -> list[tuple[str, str, str, list[str], list[bool] | None]]:
    """(group, env, task, scripted replies, the environment's labels; None = no labels)."""
    a, b = operands(SUB)
    right, answer = call(f"{a} - {b}"), f"FINAL ANSWER: {n(SUB.answer)}"
    return [
        ("g0", "calc", SUB.task_id, [call(f"{a + 4} - {b}"), right, answer], [False, True, True]),
        ("g0", "calc", SUB.task_id, [right, f"FINAL ANSWER: {n(SUB.answer + 10)}"], [True, False]),
        ("g1", "calc", SUB.task_id, [answer], [True]),
        ("g1", "calc", SUB.task_id, ["Let me see.", right, answer], [False, True, True]),
        ("g2", "echo", "t0", ["hi", "bye"], None),  # echo offers no labels
    ]


async def real_batch(service: str) -> DataProto:
    """A DataProto shaped like the trainer's after rewards and GRPO, from real agent-flow episodes."""
    outputs = []
    async with EnvClient(EnvClientSettings(env_url=service)) as env:
        for rollout, (group, env_type, task_id, replies, _) in enumerate(episodes()):
            flow = AgentFlow(AgentFlowConfig.model_validate({"max_steps": 4}), tokenizer=tokenizer(), env_client=env,
                             generate=ScriptedPolicy(replies).generate, max_model_len=4096,
                             tool_registry=ToolRegistry())
            result = await flow.run(EpisodeSpec(task_id=task_id, env_type=env_type, group_id=group,
                                                rollout_id=rollout), {"temperature": 1.0})
            assert result.num_turns == len(replies), result.error
            outputs.append(to_agent_loop_output(result, tokenizer()))
    length = max(len(o.response_ids) for o in outputs)
    mask = torch.zeros(len(outputs), length, dtype=torch.long)
    rewards = torch.zeros(len(outputs), length)
    for i, output in enumerate(outputs):
        mask[i, : len(output.response_mask)] = torch.tensor(output.response_mask)
        rewards[i, len(output.response_ids) - 1] = output.reward_score
    uid = np.array([group for group, *_ in episodes()], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask.float(), uid)
    non_tensors = {"uid": uid}
    for key in ("step_ids", "episode_record"):
        column = np.empty(len(outputs), dtype=object)
        column[:] = [o.extra_fields[key] for o in outputs]
        non_tensors[key] = column
    return DataProto.from_dict(
        tensors={"responses": torch.zeros_like(mask), "response_mask": mask, "token_level_rewards": rewards,
                 "token_level_scores": rewards.clone(), "advantages": advantages, "returns": returns},
        non_tensors=non_tensors)


def stage_config(service: str, scripted_llm: ScriptedOpenAIServer, *extra: str) -> Any:
    return compose_config([
        "attribution_driven_credit_assignment.enable=true",
        f"env_service.env_url={service}",
        f"llm.endpoints.local.base_url={scripted_llm.base_url}",
        "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
        "llm.endpoints.local.max_retries=0",
        "attribution_driven_credit_assignment.adca_grpo.alpha=0.5", *extra])


def adca_stage(config: Any, total_training_steps: int, **kwargs: Any) -> AdcaStage:
    """The stage as the trainer builds it: with the run's settings, validated once by the entry point."""
    return AdcaStage(config, total_training_steps, settings=validate_config(config), **kwargs)


def all_good(body: dict[str, Any]) -> str:
    """A judge that praises every step."""
    count = int(re.search(r"## Steps \((\d+)\)", body["messages"][-1]["content"]).group(1))
    return "\n".join(f"Step {k} Judgment: GOOD" for k in range(1, count + 1))


async def test_source_env_trains_on_environment_labels_without_any_llm_call(
        service: str, scripted_llm: ScriptedOpenAIServer) -> None:
    batch = await real_batch(service)
    grpo = batch.batch["advantages"].clone()
    scripted_llm.respond_with(all_good)  # would answer, if it were asked
    stage = adca_stage(stage_config(service, scripted_llm, "attribution_driven_credit_assignment.judge.source=env"), 10)
    metrics = stage.apply(batch, step=1)
    stage.close()

    assert not scripted_llm.requests  # no LLM call at all
    expected = [labels for *_, labels in episodes()]
    flags = list(batch.non_tensor_batch["step_flags"])
    assert flags == expected
    # the step count the environment returned is the step ids' count, episode by episode
    assert [max(ids) + 1 for ids in batch.non_tensor_batch["step_ids"]][:4] == [len(f) for f in expected[:4]]
    assert torch.equal(batch.batch["advantages"][4], grpo[4])  # echo: no labels, plain GRPO
    reference = compute_prm_grpo_advantages(batch, flags, AdcaHyper(alpha=0.5)).advantages
    assert torch.equal(batch.batch["advantages"], reference) and torch.equal(batch.batch["returns"], reference)
    assert not torch.equal(batch.batch["advantages"], grpo)
    assert metrics["adca/env/labelled_samples"] == 4 and metrics["adca/env/unlabelled_samples"] == 1
    assert metrics["adca/env/unsupported"] == 1 and metrics["adca/env_labelled_steps"] == 9
    assert metrics["adca/env/good_share"] == pytest.approx(6 / 9)
    assert metrics["adca/env/requests"] == 4  # echo is known not to label: not asked
    assert not any(key.startswith("adca/judge/") for key in metrics)


async def test_source_llm_logs_agreement_with_the_environment(service: str,
                                                              scripted_llm: ScriptedOpenAIServer) -> None:
    batch = await real_batch(service)
    scripted_llm.respond_with(all_good)
    stage = adca_stage(stage_config(service, scripted_llm), 10)  # compare_with_env: auto (the default)
    metrics = stage.apply(batch, step=1)
    stage.close()

    assert len(scripted_llm.requests) == 5  # the LLM judged every sample ...
    flags = list(batch.non_tensor_batch["step_flags"])
    assert all(f == [True] * len(f) for f in flags)  # ... and its labels are the ones trained on
    # compared: the 4 calc samples (9 steps, 6 GOOD by the environment); echo offers no labels
    assert metrics["adca/judge_env/compared_samples"] == 4 and metrics["adca/judge_env/compared_steps"] == 9
    assert metrics["adca/judge_env_agreement"] == pytest.approx(6 / 9)
    assert metrics["adca/judge_env/llm_good_env_bad"] == 3 and metrics["adca/judge_env/llm_bad_env_good"] == 0
    assert metrics["adca/env_labelled_steps"] == 9 and metrics["adca/judge/judged"] == 5

    scripted_llm.reset()
    scripted_llm.respond_with(all_good)
    off = adca_stage(stage_config(service, scripted_llm, "attribution_driven_credit_assignment.judge."
                                 "compare_with_env=false"), 10)
    quiet = off.apply(await real_batch(service), step=1)
    off.close()
    assert not any(key.startswith(("adca/judge_env", "adca/env")) for key in quiet)


async def test_a_synthetic_tasks_episode_carries_its_question_to_the_environments_labels(service: str) -> None:
    """Self-Questioning + env labels: a synthetic task runs on its seed's id with its own question; its
    record keeps what was asked (``played_task``), and the labeller sends it, so calc labels the steps."""
    query = "What is 39 * 13 - 8?"
    objective = TaskObjective(task=Task(task_id=f"{SUB.task_id}~syn-test", env_type="calc", query=query,
                                        ground_truth="499", evaluator="reference"),
                              source="synthetic", seed_task_id=SUB.task_id)
    async with EnvClient(EnvClientSettings(env_url=service)) as env:
        flow = AgentFlow(AgentFlowConfig.model_validate({"max_steps": 4}), tokenizer=tokenizer(), env_client=env,
                         generate=ScriptedPolicy([call("39 * 13"), call("39 * 13 - 9"), "FINAL ANSWER: 499"]).generate,
                         max_model_len=4096, tool_registry=ToolRegistry())
        result = await flow.run(EpisodeSpec.for_objective(objective, group_id="g"), {"temperature": 1.0})
    assert result.num_turns == 3 and result.task_id == SUB.task_id, result.error
    record = to_agent_loop_output(result, tokenizer()).extra_fields["episode_record"]
    assert record["played_task"] == {"task_id": f"{SUB.task_id}~syn-test", "query": query, "ground_truth": "499"}
    without = {**record, "played_task": None}  # what the trainer sent before the record kept the question
    own = to_agent_loop_output(await play_own_task(service), tokenizer()).extra_fields["episode_record"]
    assert own["played_task"] is None

    async with EnvClient(EnvClientSettings(env_url=service, max_retries=0)) as env:
        labels = await EnvStepLabeller(None, env).fetch([record, without], [3, 3], [True, True], {"calc": True})
    assert labels.status == ["labelled", "cannot_label"] and labels.flags[0] == [True, False, True]
    assert "params.task" in labels.errors[0]
    # judge.label_synthetic_tasks=false: the question is not sent, and the sample keeps plain GRPO
    async with EnvClient(EnvClientSettings(env_url=service, max_retries=0)) as env:
        off = await EnvStepLabeller(None, env, label_synthetic_tasks=False).fetch([record], [3], [True], {"calc": True})
    assert off.status == ["cannot_label"]


def test_the_stage_reads_label_synthetic_tasks(scripted_llm: ScriptedOpenAIServer) -> None:
    for value, expected in (("true", True), ("false", False)):
        config = stage_config("http://127.0.0.1:9", scripted_llm, "attribution_driven_credit_assignment.judge.source=env",
                              f"attribution_driven_credit_assignment.judge.label_synthetic_tasks={value}")
        stage = adca_stage(config, 10)
        assert stage.env_labeller._label_synthetic_tasks is expected
        stage.close()


async def play_own_task(service: str) -> Any:
    async with EnvClient(EnvClientSettings(env_url=service)) as env:
        flow = AgentFlow(AgentFlowConfig.model_validate({"max_steps": 4}), tokenizer=tokenizer(), env_client=env,
                         generate=ScriptedPolicy([f"FINAL ANSWER: {n(SUB.answer)}"]).generate, max_model_len=4096,
                         tool_registry=ToolRegistry())
        return await flow.run(EpisodeSpec(task_id=SUB.task_id, env_type="calc", group_id="g"), {"temperature": 1.0})


def test_compare_with_env_true_needs_the_llm_source() -> None:
    with pytest.raises(ConfigError, match="compare_with_env"):
        validate_config(compose_config(["attribution_driven_credit_assignment.judge.source=env",
                                        "attribution_driven_credit_assignment.judge.compare_with_env=true"]))
    with pytest.raises(ConfigError, match="source"):
        validate_config(compose_config(["attribution_driven_credit_assignment.judge.source=oracle"]))
    section = validate_config(compose_config([])).attribution_driven_credit_assignment.judge
    assert (section.source, section.compare_with_env) == ("llm", "auto")


def test_wire_messages_round_trip() -> None:
    episode = recorded(SUB, [f"FINAL ANSWER: {n(SUB.answer)}"])
    sent = json.loads(json.dumps([m.model_dump(mode="json", exclude_none=True) for m in episode]))
    assert [m.get("step") for m in sent][-1] == 0 and split_steps([ChatMessage.model_validate(m) for m in sent]).tagged
