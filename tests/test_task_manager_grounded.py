"""Self-Questioning grounded in observations (profile ``answers``): proofs checked by code, the ``reference``
grader and generation on the real ``calc`` service with scripted roles. Training on such tasks through ``main_ppo``
(their episodes graded by code, no LLM call) is ``test_synthetic_tasks_are_graded_by_their_own_grader`` in
tests/test_main_ppo.py, in one run with an ``llm``-graded task.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import env_service
from rich.console import Console
from scripted_openai_server import ScriptedOpenAIServer

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClients
from agentevolver.config import load_config
from agentevolver.module.task_manager import TaskManager, read_objectives, seed_tasks
from agentevolver.module.task_manager.__main__ import examples_table, summary_table
from agentevolver.module.task_manager.answers import final_answer, match_answer
from agentevolver.module.task_manager.graders import ReferenceGrader
from agentevolver.module.task_manager.profile import AnswerProof, load_profile
from agentevolver.module.task_manager.prompts import FILTER_SYSTEM, SUMMARIZER_SYSTEM
from agentevolver.module.task_manager.proof import observations, prove
from agentevolver.schema import ChatMessage, Reward, Task, ToolCall, ToolFunction, Trajectory

RULES = AnswerProof(proved_by="observations")


def _call(call_id: str, expression: str) -> ToolCall:
    return ToolCall(id=call_id, function=ToolFunction(name="calculator", arguments=json.dumps({"expression": expression})))


def _trajectory() -> Trajectory:
    """An exploration: 17 * 23 = 391, then 391 - 100 = 291, a nudge that mentions numbers, a final answer."""
    messages = [
        ChatMessage(role="system", content="You are a math assistant. Example: 12 * 31 -> 372."),
        ChatMessage(role="user", content="[MASKED]"),
        ChatMessage(role="assistant", content="", tool_calls=[_call("a", "17 * 23")]),
        ChatMessage(role="tool", content="391", tool_call_id="a", name="calculator"),
        ChatMessage(role="assistant", content="", tool_calls=[_call("b", "391 - 100")]),
        ChatMessage(role="tool", content="291", tool_call_id="b", name="calculator"),
        ChatMessage(role="assistant", content="thinking"),
        ChatMessage(role="user", content="Write it as 12 * 31 = 372, or reply with FINAL ANSWER: <number>."),
        ChatMessage(role="assistant", content="FINAL ANSWER: 291"),
    ]
    return Trajectory(task_id="t", rollout_id=0, env_type="calc", query="[MASKED]", messages=messages,
                      metadata={"opening_len": 2, "query_index": 1})


@pytest.mark.parametrize(("query", "answer", "proved", "reason"), [
    ("What is 17 times 23?", "391", True, ""),
    ("What is 17 * 23, minus 100?", "291", True, ""),  # 391 is derived from the query's own numbers
    ("Subtract 100 from 391.", "291.0", True, ""),
    ("Subtract 100 from 5 apples.", "291", False, "inputs_not_in_query"),
    ("What is 12 * 31 in this app?", "372", False, "answer_not_observed"),  # only the examples and a nudge say 372
    ("What is 12 times 12?", "144", False, "answer_not_observed"),
    ("Is the result 391 or not?", "391", False, "answer_in_query"),
    ("Multiply 17 by 23 please.", "17 * 23 = 391", False, "answer_not_one_number"),
    ("Multiply 17 by 23 please.", "about this much", False, "answer_not_one_number"),
    ("What is 17 * 23 * 2?", "391", False, "query_numbers_unused"),  # the query asks for something else
    ("What is 17 * 23, minus 100, for 4 people?", "291", False, "query_numbers_unused"),
])
def test_prove_numbers(query: str, answer: str, proved: bool, reason: str) -> None:
    proof = prove(query, answer, observations(_trajectory()), RULES)
    assert (proof.proved, proof.reason) == (proved, reason), proof.detail
    if proved:
        assert proof.call is not None and proof.call.startswith("calculator(")
    if query == "What is 17 * 23, minus 100?":  # the derivation is recorded, first call first
        assert proof.call == ('calculator({"expression": "17 * 23"}) -> calculator({"expression": "391 - 100"})')


def test_prove_without_the_inputs_rule_and_text_answers() -> None:
    record = observations(_trajectory())
    assert prove("Name a number the tool gave.", "291", record, AnswerProof(proved_by="observations",
                                                                            inputs_in_query=False)).proved
    text = AnswerProof(proved_by="observations", kind="text")
    assert prove("What does the assistant get told to write?", "final  ANSWER", record, text).proved
    assert prove("What city is it?", "Paris", record, text).reason == "answer_not_observed"


@pytest.mark.parametrize(("text", "reference", "correct"), [
    ("FINAL ANSWER: 391", "391", True),
    ("so the final answer is $3,500 in total", "3500", True),
    ("FINAL ANSWER: 390.9999999", "391", True),
    ("FINAL ANSWER: 392 FINAL ANSWER: 391", "391", False),  # the first answer counts
    ("391", "391", False),  # no marker, no answer
    ("Final answer: Paris.", "paris", True),
])
def test_final_answers_match_the_reference(text: str, reference: str, correct: bool) -> None:
    assert match_answer(final_answer(text), reference).correct is correct


def test_the_reference_grader_scores_the_last_agent_message_with_the_profile_marker() -> None:
    _cfg, settings = load_config([])
    grader = ReferenceGrader(settings, None)
    task = Task(task_id="s~syn-1", env_type="calc", query="What is 17 * 23?", ground_truth="391")

    def grade(*texts: str, reward: Reward | None = None) -> Reward:
        messages = [{"role": "user", "content": task.query}] + [
            {"role": "assistant", "content": text, "author": "llm"} for text in texts]
        return asyncio.run(grader.agrade(task, messages, reward or Reward()))[0]

    assert grade("calculator please", "FINAL ANSWER: 391").outcome == 1.0
    assert grade("FINAL ANSWER: 391", "I changed my mind").outcome == 0.0
    wrong = grade("FINAL ANSWER: 390")
    assert (wrong.outcome, wrong.description) == (0.0, "reference grader: answer 390 differs from reference 391")
    mad = Reward(madness=-1.0, description="repetition")
    assert grade("FINAL ANSWER: 391", reward=mad) == mad
    assert grader.rules("calc") == load_profile("calc").answers
    assert grader.rules("no_such_env") == RULES  # no profile: the defaults


# -- generation on the real calc service ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc", tmp_path=tmp_path_factory.mktemp("calc")) as running:
        yield running.url


def _roles(body: dict[str, Any]) -> str:
    """The explorer computes 17 * 23; the task writer proposes one proved task, one whose answer the
    exploration never saw, one whose query lacks the inputs; the feasibility judge would reject everything."""
    system = body["messages"][0]["content"]
    if system.startswith(SUMMARIZER_SYSTEM):
        assert "391" in body["messages"][-1]["content"]
        return json.dumps({"tasks": [
            {"query": "What is 17 multiplied by 23?", "answer": "391", "evidence": "391"},
            {"query": "What is 1000 minus 1 exactly?", "answer": "999", "evidence": "999"},
            {"query": "What does the tool give for this?", "answer": "391", "evidence": "391"},
        ]})
    if system.startswith(FILTER_SYSTEM):
        return '{"feasible": false, "reason": "a judge with no signal"}'
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'


def test_generation_keeps_only_proved_tasks_and_grades_them_by_reference(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(_roles)
    _cfg, settings = load_config([
        "env_service.env_type=calc", f"env_service.env_url={calc}", "env_service.max_retries=0",
        f"llm.endpoints.local.base_url={scripted_llm.base_url}", "llm.endpoints.local.max_retries=0",
        "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
        f"task_manager.synthetic_tasks_path={tmp_path / 'tasks.jsonl'}",
        f"task_manager.checkpoint_path={tmp_path / 'checkpoint.json'}",
        "task_manager.n=1", "task_manager.num_seed_tasks=2", "task_manager.max_explore_step=1",
        "task_manager.num_explore_threads=1", "task_manager.parse_retries=0",
    ])
    with EnvClient.from_config(settings.env_service) as env, LLMClients(settings.llm) as llm:
        report = TaskManager.from_settings(settings, env=env, llm=llm).generate_task(seed_tasks(env, settings))

    c = report.counts
    assert (c["answers_checked"], c["answers_proved"]) == (6, 2)
    assert report.rejections() == {"answer_not_observed": 2, "inputs_not_in_query": 2}
    assert report.rates()["proof_rate"] == pytest.approx(2 / 6)
    assert report.rates()["structured_share"] == 1.0  # the scripted server took the schema
    # the proved task of each seed was written; the judge was never asked about them
    written = read_objectives(tmp_path / "tasks.jsonl")
    assert [o.task.query for o in written] == ["What is 17 multiplied by 23?"] * 2
    task = written[0].task
    assert (task.ground_truth, task.evaluator) == ("391", "reference")
    assert task.metadata["proof"]["call"] == 'calculator({"expression": "17 * 23"})'
    assert (c["judged"], c["judged_without_llm"], c["judged_kept"]) == (2, 2, 2)
    bodies = scripted_llm.bodies
    assert not any(b["messages"][0]["content"].startswith(FILTER_SYSTEM) for b in bodies)
    summary = next(b for b in bodies if b["messages"][0]["content"].startswith(SUMMARIZER_SYSTEM))
    schema = summary["response_format"]["json_schema"]["schema"]
    assert schema["$defs"]["GroundedItem"]["required"] == ["query", "answer", "evidence"]

    console = Console(record=True, width=200)
    console.print(summary_table(report, 2))
    console.print(examples_table(report))
    text = console.export_text()
    assert "proof rate 33.3%" in text and "answer_not_observed 2, inputs_not_in_query 2" in text
    assert "What is 17 multiplied by 23?" in text and "calculator(" in text


def test_the_explorer_sees_demonstrated_calls_the_way_its_parser_reads_them() -> None:
    from agentevolver.module.task_manager.transcript import for_chat_server
    from agentevolver.module.tools.parsing.hermes import HermesParser

    demo = ChatMessage(role="assistant", content="", tool_calls=[_call("a", "17 * 23")])
    shown = for_chat_server([demo], 100, tagged_calls=True)[0]["content"]
    assert shown == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
    assert [c.function.name for c in HermesParser().parse(shown).tool_calls] == ["calculator"]
    assert for_chat_server([demo], 100)[0]["content"] == '{"name": "calculator", "arguments": {"expression": "17 * 23"}}'
