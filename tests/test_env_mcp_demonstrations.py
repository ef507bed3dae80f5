"""Demonstrations from nothing for the ``mcp`` environment: made at service start by calling the real time
server (``mcp-server-time`` from the package index), shown in every opening, refused with the key named when
they cannot be made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from env_service_fixture import REPO_ROOT, env_service
from ports import free_port

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")

from env_service.environments.mcp.demonstrations import default_question, derive_arguments

TIME = {"name": "time", "command": ["mcp-server-time", "--local-timezone", "Etc/UTC"]}
TASKS = [{"id": "t1", "query": "It is 10:00 in Asia/Tokyo. What time is it in Europe/London?", "answer": "01:00"}]


@pytest.mark.parametrize(("prop", "value"), [
    ({"type": "string", "examples": ["a", "b"]}, "a"),
    ({"type": "string", "enum": ["x", "y"]}, "x"),
    ({"type": "string", "default": "d"}, "d"),
    ({"type": "string", "description": "IANA timezone name (e.g., 'America/New_York', 'Europe/London')."},
     "America/New_York"),
    ({"type": "string", "description": "A path, for example `/tmp/x`"}, "/tmp/x"),
    ({"type": "integer", "minimum": 3}, 3),
    ({"type": "number"}, 1),
    ({"type": "boolean"}, False),
])
def test_arguments_come_from_the_input_schema(prop: dict, value: object) -> None:
    arguments, missing = derive_arguments({"properties": {"p": prop, "optional": {"type": "string"}},
                                           "required": ["p"]})
    assert arguments == {"p": value} and missing == []  # optional properties are left out


def test_a_property_the_schema_gives_no_value_for_is_named() -> None:
    arguments, missing = derive_arguments({"properties": {"time": {"type": "string", "description": "HH:MM"}},
                                           "required": ["time"]})
    assert arguments == {} and missing == ["time"]
    assert default_question("get_time", "Get the time. Then more.", {"zone": "UTC"}) == "Get the time (zone: UTC)"


def _config(folder: Path, demonstrations: list) -> dict[str, str]:
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    path = folder / "servers.json"
    path.write_text(json.dumps({"servers": [TIME], "tasks": "tasks.jsonl", "demonstrations": demonstrations}))
    return {"AGENTEVOLVER_MCP_CONFIG": str(path)}


def test_every_opening_shows_the_demonstrations_with_the_servers_real_results(tmp_path: Path) -> None:
    demonstrations = [
        "get_current_time",  # arguments from its schema: the description's first example
        {"tool": "convert_time", "arguments": {"source_timezone": "Europe/Berlin", "time": "08:00",
                                               "target_timezone": "Asia/Tokyo"},
         "question": "It is 08:00 in Berlin. What time is it in Tokyo?", "answer": "16:00"},
    ]
    with env_service("mcp", tmp_path=tmp_path, env=_config(tmp_path, demonstrations)) as service:
        answer = httpx.post(f"{service.url}/create", json={"env_type": "mcp", "task_id": "t1",
                                                           "params": {"shape": "native"}}, timeout=60)
    assert answer.status_code == 200, answer.text
    opening = answer.json()["data"]["state"]
    assert [m["role"] for m in opening] == ["system", *["user", "assistant", "tool", "assistant"] * 2, "user"]
    first_call = opening[2]["tool_calls"][0]["function"]
    assert first_call["name"] == "get_current_time"
    assert json.loads(first_call["arguments"]) == {"timezone": "America/New_York"}
    assert json.loads(opening[3]["content"])["timezone"] == "America/New_York"  # the server's real answer
    assert opening[3]["tool_call_id"] == opening[2]["tool_calls"][0]["id"]
    assert opening[4]["content"].startswith("FINAL ANSWER: ")
    assert opening[5]["content"] == "It is 08:00 in Berlin. What time is it in Tokyo?"
    assert json.loads(opening[7]["content"])["target"]["timezone"] == "Asia/Tokyo"
    assert opening[8]["content"] == "FINAL ANSWER: 16:00"
    assert opening[-1]["content"] == TASKS[0]["query"]


@pytest.mark.parametrize(("demonstrations", "needle"), [
    (["convert_time"], "demonstrations[0]: the input schema of 'convert_time' gives no value for time; set "
                       "demonstrations[0].arguments"),
    (["no_such_tool"], "demonstrations[0].tool: no tool 'no_such_tool'"),
    ([{"tool": "get_current_time", "arguments": {"timezone": "Mars/Olympus"}}],
     "demonstrations[0]: 'get_current_time' answered an error"),
    ([{"tool": "get_current_time", "arguments": {}}], "demonstrations[0].arguments: "),
])
def test_a_demonstration_that_cannot_be_made_stops_the_service_naming_the_key(tmp_path: Path, demonstrations: list,
                                                                             needle: str) -> None:
    result = subprocess.run([sys.executable, str(REPO_ROOT / "env_service" / "env_service.py"), "--env", "mcp",
                             "--port", str(free_port())], capture_output=True, text=True, cwd=REPO_ROOT,
                            env={**os.environ, **_config(tmp_path, demonstrations)}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_smollm2_calls_the_time_servers_tool_when_its_opening_has_demonstrations(tmp_path: Path) -> None:
    """The policy of the CPU default, through the rollout job: with examples/mcp/servers.yaml's four demonstrations
    it calls the time server's tool (measured: in 30 of 32 sampled episodes; 0 of 32 with a bare opening)."""
    import yaml

    tasks = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "mcp" / "time_tasks.py")],
                           capture_output=True, text=True, check=True).stdout
    (tmp_path / "tasks.jsonl").write_text(tasks)
    config = yaml.safe_load((REPO_ROOT / "examples" / "mcp" / "servers.yaml").read_text())
    config["tasks"] = str(tmp_path / "tasks.jsonl")
    (tmp_path / "servers.yaml").write_text(yaml.safe_dump(config))
    with env_service("mcp", tmp_path=tmp_path, env={"AGENTEVOLVER_MCP_CONFIG": str(tmp_path / "servers.yaml")}) as env:
        done = subprocess.run(
            [sys.executable, "-m", "agentevolver.rollout", "--config-name", "mcp", "--split", "val", "--num-tasks", "4",
             "--n", "2", "--seed", "0", "--run-dir", str(tmp_path / "run"), f"env_service.env_url={env.url}"],
            capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts" / "step_0.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["failure"] is None for r in records)
    called = [r for r in records if any(m["role"] == "tool" and int(m.get("step", -1)) >= 0 for m in r["messages"])]
    assert len(called) >= 3, [r["messages"][-1]["content"][:200] for r in records]
