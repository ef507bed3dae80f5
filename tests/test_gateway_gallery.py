"""The gallery's agents (examples/agent_program/), each unchanged against the gateway with a scripted policy:
the OpenAI Agents SDK with its defaults (the Responses API, a command program reading OPENAI_BASE_URL) and a
LangGraph ReAct agent (Chat Completions, a callable). Each calls its local calculator, answers, and calc scores
the answer. Training them through ``main_ppo`` is tests/test_agent_gateway_training.py.
"""

from __future__ import annotations

import sys

import pytest
from test_agent_gateway import (  # the gateway tests' fixtures and scripted policy
    CALL,
    REPO_ROOT,
    SAMPLING,
    ScriptedPolicy,
    check_invariants,
    env,  # noqa: F401  (fixture)
    episodes,
    service,  # noqa: F401  (fixture)
    spec,
    tokenizer,
)

from agentevolver.client.env_client import EnvClient

GALLERY = REPO_ROOT / "examples" / "agent_program"
PROGRAMS = {
    "agents_sdk": {"command": [sys.executable, str(GALLERY / "agents_sdk_agent.py")]},
    "langgraph": {"callable": f"{GALLERY / 'langgraph_agent.py'}:run"},
}


@pytest.mark.parametrize("framework", sorted(PROGRAMS))
async def test_a_gallery_agent_calls_its_tool_and_calc_scores_its_answer(env: EnvClient, framework: str) -> None:  # noqa: F811
    from env_service.environments.calc.tasks import get_task

    task = get_task("train-single-000")
    answer = f"{task.answer:g}"
    policy = ScriptedPolicy([CALL % task.solution["arguments"]["expression"], f"FINAL ANSWER: {answer}"])
    source = episodes(env, policy, reward="env", timeout_s=300, **PROGRAMS[framework])
    result = await source.run(spec(), SAMPLING)
    assert (result.termination, result.failure, result.success) == ("finished", None, True), result.error
    assert len(result.samples) == 1 and result.num_turns == 2  # the tool result extended the first call's sample
    check_invariants(result)
    first, second = policy.calls
    assert task.query in tokenizer().decode(first["prompt_ids"])  # the environment's opening was sent
    assert answer in tokenizer().decode(second["prompt_ids"][len(first["prompt_ids"]):])  # the tool ran locally

    wrong = ScriptedPolicy(["FINAL ANSWER: -1"])
    result = await episodes(env, wrong, reward="env", timeout_s=300, **PROGRAMS[framework]).run(spec(), SAMPLING)
    assert (result.failure, result.success, result.reward.outcome) == (None, False, 0.0), result.error
