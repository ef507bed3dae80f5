"""Exploration seeds (split ``explore``, one per tool, not tasks) in every built-in environment that offers them.

calc's are tested with the task writer in tests/test_sq_from_nothing.py; here codebox's (in process) and mcp's,
through the real env service serving ``mcp-server-time``: mcp lists the seeds in ``explore`` even when a task
file gives it tasks of its own, and a seed is created and played like a task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from env_service_fixture import RunningService, env_service

from agentevolver.client.env_client import EnvClient, EnvClientSettings
from agentevolver.schema import ChatMessage, ToolCall, ToolFunction
from env_service.environments.codebox import CodeBoxEnv
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, tool_seeds


def test_tool_seeds_are_one_per_tool_named_after_it() -> None:
    schemas = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.\nMore."}},
               {"name": "bare"}, {"function": {"name": " "}}]
    seeds = tool_seeds(schemas)
    assert list(seeds) == ["explore-add", "explore-bare"]
    assert "`add` can do (Add two numbers.)" in seeds["explore-add"] and "(no description)" in seeds["explore-bare"]


def test_codebox_seeds_play_like_tasks_and_a_submission_is_not_graded() -> None:
    assert CodeBoxEnv.task_ids(EXPLORE_SPLIT) == ["explore-run_python", "explore-submit"]
    assert EXPLORE_SPLIT not in CodeBoxEnv.splits()  # a split of seeds, not of tasks
    env = CodeBoxEnv("explore-submit", "i-1", {})
    assert "`submit` can do" in env.reset()[-1].content
    call = ToolCall(id="c0", function=ToolFunction(name="submit", arguments=json.dumps({"code": "x = 1"})))
    outcome = env.step(ChatMessage(role="assistant", content="", tool_calls=[call]))
    assert outcome.is_terminated and outcome.reward == 0.0 and "exploration seed" in outcome.state[0].content
    assert env.evaluate(sparse=True) == 0.0 and env.info()["difficulty"] == "seed"


@pytest.fixture(scope="module")
def mcp_with_tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")
    folder = tmp_path_factory.mktemp("mcp_seeds")
    (folder / "tasks.jsonl").write_text(json.dumps({"id": "utc-day", "query": "What weekday is it in UTC?",
                                                    "answer": "day"}) + "\n")
    config = {"servers": [{"name": "time", "command": ["mcp-server-time", "--local-timezone", "Etc/UTC"]}],
              "tasks": "tasks.jsonl", "max_steps": 3}
    (folder / "servers.json").write_text(json.dumps(config))
    with env_service("mcp", tmp_path=folder, env={"AGENTEVOLVER_MCP_CONFIG": str(folder / "servers.json")}) as svc:
        yield svc


def test_mcp_lists_seeds_in_explore_beside_a_task_file_and_plays_one(mcp_with_tasks: RunningService) -> None:
    with EnvClient(EnvClientSettings(env_url=mcp_with_tasks.url, max_retries=0)) as env:
        assert env.get_env_profile("mcp", "train") == ["utc-day"]
        seeds = env.get_env_profile("mcp", EXPLORE_SPLIT)
        assert seeds and all(s.startswith("explore-") for s in seeds) and "explore-get_current_time" in seeds
        created = env.create("mcp", "explore-get_current_time")
        try:
            assert "`get_current_time` can do" in created.state[-1].content
        finally:
            env.release(created.info.instance_id)
