"""Tasks for the ``mcp`` environment: a user's task file, and Self-Questioning from nothing but a server config.

With no task file, the real env service (serving ``mcp-server-time`` from PyPI) offers one exploration seed
per tool; the task manager derives a profile from the tool list, the scripted OpenAI-compatible server plays
explorer, writer, feasibility judge and grader, and the grader scores an episode run on a written task. The
last test goes from the server config to a 2-step tiny-test training run through ``launcher.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import REPO_ROOT, RunningService, env_service
from ports import free_port
from scripted_openai_server import Reply, ScriptedOpenAIServer
from training_fixture import training_command, training_timeout

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClients
from agentevolver.config import load_config
from agentevolver.module.task_manager import GraderPool, TaskManager, read_objectives, seed_tasks
from agentevolver.module.task_manager.prompts import (
    FILTER_SYSTEM,
    GRADER_SYSTEM,
    SUMMARIZER_SYSTEM,
)
from agentevolver.module.task_manager.tool_profile import profile_from_tools
from agentevolver.schema import Reward
from env_service.environments.mcp.tasks import (
    McpTask,
    check_answer,
    exploration_seeds,
    final_answer,
    load_task_file,
)
from env_service.errors import EnvUnavailable

TIME_CONFIG = {"servers": [{"name": "time", "command": ["mcp-server-time", "--local-timezone", "Etc/UTC"]}],
               "max_steps": 3}


def _role(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    for prefix, role in ((SUMMARIZER_SYSTEM, "writer"), (FILTER_SYSTEM, "filter"), (GRADER_SYSTEM, "grader")):
        if system.startswith(prefix):
            return role
    return "explorer" if "EXPLORING" in system else "other"


class Roles:
    """Explorer: calls the time tool (hermes block), then says what it saw. Writer: one new task per record,
    about the tool it saw. Judge: feasible. Grader: success (graded scoring)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.seen: dict[str, list[str]] = {}

    def __call__(self, body: dict[str, Any]) -> Reply | str:
        role = _role(body)
        self.calls[role] += 1
        text = "\n".join(str(m.get("content") or "") for m in body["messages"])
        self.seen.setdefault(role, []).append(text)
        if role == "explorer":
            if "day_of_week" in text:  # a tool result came back
                return "The tool answered with the date, the weekday and whether DST applies."
            return ('<tool_call>\n{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}\n'
                    "</tool_call>")
        if role == "writer":
            number = self.calls[role]
            return json.dumps({"tasks": [{"query": f"Report the current weekday in Tokyo, attempt {number}.",
                                          "answer": "the weekday the time tool gives", "confidence": 0.8}]})
        if role == "filter":
            return '{"feasible": true, "reason": "the time tool gives the weekday"}'
        if role == "grader":
            if '"relevance"' in text:
                return '{"relevance": 1, "success": 1, "efficiency": 1, "reason": "called the tool and answered"}'
            return '{"relevant": true, "success": true, "efficient": true, "reason": "answered"}'
        return Reply.error(418, f"unexpected role: {body['messages'][0]['content'][:80]!r}")


@pytest.fixture(scope="module")
def time_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    folder = tmp_path_factory.mktemp("mcp_time")
    (folder / "servers.json").write_text(json.dumps(TIME_CONFIG))
    with env_service("mcp", tmp_path=folder, env={"AGENTEVOLVER_MCP_CONFIG": str(folder / "servers.json")}) as svc:
        yield svc


# ------------------------------------------------------------------------------------------- units
def test_task_file_lines_get_ids_and_errors_name_the_line(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text('{"query": "a"}\n\n{"query": "b", "split": "val", "answer": "x"}\n{"id": "c", "query": "c"}\n')
    assert [(t.id, t.split) for t in load_task_file(good)] == [("train-0001", "train"), ("val-0001", "val"),
                                                               ("c", "train")]
    bad = tmp_path / "bad.jsonl"
    for text, needle in [('{"query": ""}', "line 1: query"), ('{"query": "q", "checker": {"type": "exact"}}',
                                                              "needs value or the task's answer"),
                         ('{"query": "q", "chekcer": 1}', "line 1: chekcer: Extra inputs"),
                         ('{"query": "q", "checker": {"type": "tool"}}', "a tool checker needs tool"),
                         ("not json", "line 1 is not JSON"), ('{"id": "a", "query": "q"}\n{"id": "a", "query": "r"}',
                                                               "line 2: id 'a' is used twice")]:
        bad.write_text(text)
        with pytest.raises(EnvUnavailable, match=needle.replace("(", r"\(").replace(")", r"\)")):
            load_task_file(bad)


@pytest.mark.parametrize(("checker", "answer", "given", "ok"), [
    (None, "Tuesday", "FINAL ANSWER: it is tuesday", True),
    (None, "Tuesday", "Monday", False),
    ({"type": "exact"}, "UTC", " utc ", True),
    ({"type": "regex", "value": r"\d{4}-\d{2}-\d{2}"}, None, "2026-12-01", True),
    ({"type": "number", "value": 9}, None, "offset is +9.0 hours", True),
    ({"type": "number", "value": 9}, None, "no number", False),
])
def test_answer_checkers(checker: dict[str, Any] | None, answer: str | None, given: str, ok: bool) -> None:
    task = McpTask(id="t", query="q", answer=answer, checker=checker)
    assert check_answer(task, final_answer(given, "FINAL ANSWER")) is ok


def test_a_profile_is_derived_from_the_tool_list() -> None:
    tools = [{"type": "function", "function": {"name": "get_current_time", "description": "Get the time.\nMore.",
                                               "parameters": {"properties": {"timezone": {"type": "string"}}}}},
             {"type": "function", "function": {"name": "ping", "description": "", "parameters": {}}}]
    profile = profile_from_tools("mcp", tools)
    assert [e.name for e in profile.entities] == ["get_current_time", "ping"]
    assert profile.entities[0].operations[0].description == "Get the time."
    assert profile.entities[0].attributes[0].name == "timezone"
    assert "get_current_time, ping" in profile.description and profile.answers is None
    seeds = exploration_seeds([("get_current_time", "time", "Get the time.")])
    assert [(s.id, s.split, s.seed) for s in seeds] == [("explore-get_current_time", "train", True),
                                                          ("explore-get_current_time-val", "val", True)]


# ------------------------------------------------------------------------------------------- no task file
def test_query_free_generation_writes_tasks_and_the_grader_scores_an_episode(
        time_service: RunningService, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = Roles()
    scripted_llm.respond_with(roles)
    _cfg, settings = load_config([
        "env_service.env_type=mcp", f"env_service.env_url={time_service.url}", "env_service.create_params={}",
        "env_service.max_retries=0", f"llm.endpoints.local.base_url={scripted_llm.base_url}",
        "llm.endpoints.local.max_retries=0", "llm.endpoints.local.max_tokens=64",
        f"task_manager.synthetic_tasks_path={tmp_path / 'tasks.jsonl'}",
        f"task_manager.checkpoint_path={tmp_path / 'checkpoint.json'}",
        "task_manager.n=1", "task_manager.num_seed_tasks=-1", "task_manager.max_explore_step=2",
        "task_manager.num_explore_threads=1", "task_manager.tasks_per_exploration=1",
    ])
    with EnvClient.from_config(settings.env_service) as env, LLMClients(settings.llm) as llm:
        seeds = seed_tasks(env, settings)
        assert [s.task_id for s in seeds] == ["explore-get_current_time", "explore-convert_time"]
        report = TaskManager.from_settings(settings, env=env, llm=llm).generate_task(seeds)
        objectives = read_objectives(tmp_path / "tasks.jsonl")
        assert report.counts["explorations_run"] == 2 and len(objectives) == 2
        # the explorer was shown the profile derived from the tool list, and the tool's result came back
        assert all("Environment `mcp`: An environment whose tools are get_current_time, convert_time" in text
                   for text in roles.seen["explorer"])
        assert any("day_of_week" in text for text in roles.seen["writer"])
        task = objectives[0].task
        seed = objectives[0].seed_task_id
        assert task.env_type == "mcp" and task.evaluator == "llm" and seed == "explore-get_current_time"
        assert task.task_id.startswith(f"{seed}~syn-")
        assert "Tokyo" in (task.query or "")

        # an episode on the written task (its query in the seed's instance), graded by the task_grader LLM
        created = env.create("mcp", seed)
        iid = created.info.instance_id
        call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_current_time", "arguments": '{"timezone": "Asia/Tokyo"}'}}]}
        observed = env.step(iid, call)
        final = {"role": "assistant", "content": "FINAL ANSWER: " + observed.state[0].content[:60]}
        env.step(iid, final)
        env.release(iid)
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": task.query},
                    call, *[m.model_dump() for m in observed.state], final]
        reward, metrics = _grade(settings, llm, task, messages)
    assert reward.outcome == 1.0 and metrics["grader/replies"] == 1.0
    grader_text = roles.seen["grader"][-1]
    assert "Tokyo" in grader_text and "day_of_week" in grader_text  # the judge saw the task and the tool result


def _grade(settings: Any, llm: LLMClients, task: Any, messages: list[dict[str, Any]]) -> tuple[Reward, dict]:
    import asyncio

    return asyncio.run(GraderPool(settings, llm).get(task.evaluator).agrade(task, messages, Reward()))


# ------------------------------------------------------------------------------------------- training
@training_timeout
def test_launcher_trains_two_steps_on_mcp_tasks_written_from_the_tool_list(
        scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    """From a server config to a training run: the launcher starts the env service on mcp-server-time, the
    trainer generates tasks with the scripted writer before training, and the scripted grader scores every
    episode (tiny-test policy, 2 steps)."""
    roles = Roles()
    scripted_llm.respond_with(roles)
    (tmp_path / "servers.json").write_text(json.dumps(TIME_CONFIG))
    env_port = free_port()
    overrides = training_command(f"http://127.0.0.1:{env_port}", tmp_path)[5:]
    replaced = ("env_service.env_type=", "env_service.create_params=", "trainer.experiment_name=")
    overrides = [o for o in overrides if not o.startswith(replaced)]
    done = subprocess.run([
        sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(REPO_ROOT / "examples" / "mcp.yaml"),
        "--with-env", "--", *overrides, "trainer.experiment_name=mcp_e2e",
        "actor_rollout_ref.model.path=tiny-test",
        f"llm.endpoints.local.base_url={scripted_llm.base_url}", "llm.endpoints.local.max_tokens=64",
        "task_manager.n=1", "task_manager.max_explore_step=2", "task_manager.num_explore_threads=1",
        "task_manager.tasks_per_exploration=1", "task_manager.mixture.synthetic_data_ratio=1",
        f"task_manager.synthetic_tasks_path={tmp_path / 'synthetic.jsonl'}",
        f"task_manager.checkpoint_path={tmp_path / 'checkpoint.json'}",
        "agent_flow.max_steps=2", "data.max_prompt_length=1024",
        "launcher.services.env.extra_args=[--log-level,warning]", "launcher.shutdown_grace_s=20",
    ], cwd=tmp_path, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "AGENTEVOLVER_MCP_CONFIG": str(tmp_path / "servers.json")})
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    objectives = read_objectives(tmp_path / "synthetic.jsonl")
    assert len(objectives) == 2 and all(o.task.evaluator == "llm" for o in objectives)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert rows and all(r["env_type"] == "mcp" and r["task_id"].startswith("explore-") for r in rows)
    assert all(r["reward"]["description"].startswith("llm grader") for r in rows)  # synthetic tasks, judged
    assert roles.calls["writer"] == 2 and roles.calls["grader"] >= 4  # every training episode was judged
    record = json.loads((tmp_path / "launcher_record" / "mcp_e2e" / "launch.json").read_text())
    assert record["exit_code"] == 0 and [(s["name"], s["action"]) for s in record["services"]] == [("env", "started")]
