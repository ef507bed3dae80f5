"""The ``mcp`` environment through the env service's HTTP API, against MCP servers from the package index.

Third-party servers (pip, not ours): ``mcp-server-time`` (twice, so tool names collide), ``mcp-server-git``
on a repository the test creates (one server per instance), ``mcp-server-fetch`` pointed at a socket that
never answers (the hanging tool), and ``mcp-server-sqlite`` 2025.4.25, which crashes at start-up under the
``mcp`` 2.x SDK (the server that fails to start). A probe server written with the official SDK checks what
only our own code can show: which environment variables a stdio server gets, and the streamable-HTTP
transport.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from env_service_fixture import REPO_ROOT, RunningService, env_service
from ports import free_port

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")

PROBE_SERVER = textwrap.dedent('''
    """A probe MCP server (official SDK): stdio by default, streamable HTTP on the port given."""
    import os
    import sys

    from mcp.server.mcpserver import MCPServer

    app = MCPServer("probe")


    @app.tool()
    def getenv(name: str) -> str:
        """The value of one environment variable of this server, or <unset>."""
        return os.environ.get(name, "<unset>")


    if __name__ == "__main__":
        if len(sys.argv) > 1:
            app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
        else:
            app.run()
''')


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository: one small commit, then one whose diff is far over the result limit."""
    path = tmp_path_factory.mktemp("repo")
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@example.com")
    _git(path, "config", "user.name", "tester")
    (path / "a.txt").write_text("hello\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-qm", "first commit")
    (path / "big.txt").write_text("".join(f"line {i} of a big file\n" for i in range(2000)))
    _git(path, "add", "big.txt")
    _git(path, "commit", "-qm", "big file")
    return path


@pytest.fixture(scope="module")
def hang_url() -> Iterator[str]:
    """A URL whose server accepts connections and never answers (the kernel completes the handshake)."""
    port = free_port()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(16)
    yield f"http://127.0.0.1:{port}/slow"
    sock.close()


@pytest.fixture(scope="module")
def http_probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The probe server over streamable HTTP; yields its URL."""
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe.py").write_text(PROBE_SERVER)
    port = free_port()
    log = open(folder / "http.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen([sys.executable, str(folder / "probe.py"), str(port)], stdout=log,
                               stderr=subprocess.STDOUT, env={**os.environ, "PROBE_SIDE": "http"})
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(300):  # readiness, not a time limit
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert process.poll() is None, (folder / "http.log").read_text()
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _write_config(folder: Path, repo: Path, hang_url: str, http_probe: str) -> Path:
    (folder / "probe.py").write_text(PROBE_SERVER)
    tasks = [
        {"id": "utc-zone", "query": "Which timezone name does the time server report for UTC?", "answer": "UTC",
         "servers": ["time", "clock"]},
        {"id": "commit-notes", "query": "Add notes.txt to the repository and commit it as 'add notes'.",
         "checker": {"type": "tool", "tool": "git_log", "arguments": {"repo_path": str(repo)},
                     "expect": "add notes"}, "servers": ["git"]},
        {"id": "read-slow", "query": f"Fetch {hang_url}.", "servers": ["fetch"]},
        {"id": "probe-env", "query": "Read the variable SECRET_TOKEN.", "servers": ["probe", "web"]},
        {"query": "What is the UTC time?", "split": "val", "answer": "UTC", "checker": {"type": "contains"}},
    ]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {
        "servers": [
            {"name": "time", "command": ["mcp-server-time", "--local-timezone", "Etc/UTC"]},
            {"name": "clock", "command": ["mcp-server-time", "--local-timezone", "Europe/Paris"]},
            {"name": "git", "command": ["mcp-server-git", "--repository", str(repo)], "scope": "instance",
             "max_result_chars": 2000},
            {"name": "fetch", "command": ["mcp-server-fetch", "--ignore-robots-txt", "--allow-private-ips"], "call_timeout_s": 2},
            {"name": "probe", "command": [sys.executable, str(folder / "probe.py")], "inherit_env": ["PASSED_VAR"]},
            {"name": "web", "url": http_probe},
        ],
        "tasks": "tasks.jsonl",
        "max_steps": 6,
    }
    path = folder / "servers.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, repo: Path, hang_url: str,
            http_probe: str) -> Iterator[RunningService]:
    folder = tmp_path_factory.mktemp("mcp")
    config = _write_config(folder, repo, hang_url, http_probe)
    env = {"AGENTEVOLVER_MCP_CONFIG": str(config), "SECRET_TOKEN": "s3cret", "PASSED_VAR": "visible"}
    with env_service("mcp", tmp_path=folder, env=env) as running:
        yield running


def _post(service: RunningService, route: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{service.url}{route}", json=body, timeout=60)


def _create(service: RunningService, task_id: str, **params: Any) -> str:
    response = _post(service, "/create", env_type="mcp", task_id=task_id, params={"shape": "native", **params})
    assert response.status_code == 200, response.text
    return response.json()["data"]["info"]["instance_id"]


def _call(service: RunningService, instance_id: str, name: str, arguments: dict[str, Any]) -> httpx.Response:
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
    return _post(service, "/step", instance_id=instance_id, messages=message, params={"shape": "native"})


def _tool_text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    state = response.json()["data"]["state"]
    assert [m["role"] for m in state] == ["tool"]
    return state[0]["content"]


def _answer(service: RunningService, instance_id: str, text: str) -> dict[str, Any]:
    response = _post(service, "/step", instance_id=instance_id, messages={"role": "assistant", "content": text},
                     params={"shape": "native"})
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _server_pids(service: RunningService, needle: str) -> list[int]:
    pids = []
    for child in psutil.Process(service.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # it exited since it was listed (a stopping server)
            if needle in " ".join(child.cmdline()):
                pids.append(child.pid)
    return pids


def _healthy(service: RunningService) -> None:
    assert httpx.get(f"{service.url}/healthz", timeout=10).text == "OK"


# ---------------------------------------------------------------------------------------------- listing
def test_tools_are_the_servers_tools_with_colliding_names_prefixed(service: RunningService) -> None:
    tools = httpx.get(f"{service.url}/envs/mcp/tools", timeout=30).json()["data"]
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    # Two time servers list the same tools: both are prefixed; unique names stay as they are.
    assert {"time__get_current_time", "clock__get_current_time", "time__convert_time"} <= set(by_name)
    assert "get_current_time" not in by_name
    assert {"git_log", "git_commit", "git_add", "fetch"} <= set(by_name)
    assert {"probe__getenv", "web__getenv"} <= set(by_name)  # stdio and HTTP probe collide too
    assert "repo_path" in by_name["git_log"]["parameters"]["required"]
    assert by_name["git_log"]["description"]
    profile = _post(service, "/get_env_profile", env_type="mcp", params={"split": "train"}).json()["data"]
    assert profile == ["utc-zone", "commit-notes", "read-slow", "probe-env"]
    assert _post(service, "/get_env_profile", env_type="mcp", params={"split": "val"}).json()["data"] == ["val-0001"]


def test_an_instance_sees_only_its_tasks_servers(service: RunningService) -> None:
    iid = _create(service, "commit-notes")
    info = _post(service, "/get_info", instance_id=iid).json()["data"]
    assert info["servers"] == ["git"]
    assert {t["function"]["name"] for t in info["tools"]} >= {"git_log", "git_commit"}
    assert not any(t["function"]["name"].startswith("time__") for t in info["tools"])
    reference = _post(service, "/create", env_type="mcp", task_id="utc-zone").json()["data"]["state"]
    assert "<tools>" in reference[0]["content"] and "clock__get_current_time" in reference[0]["content"]
    _post(service, "/release", instance_id=iid)


# ---------------------------------------------------------------------------------------------- calls
def test_time_server_call_structured_result_and_a_graded_answer(service: RunningService) -> None:
    iid = _create(service, "utc-zone")
    text = _tool_text(_call(service, iid, "time__get_current_time", {"timezone": "UTC"}))
    assert '"timezone": "UTC"' in text and "day_of_week" in text
    data = _answer(service, iid, "The server says FINAL ANSWER: UTC")
    assert data["is_terminated"] and data["reward"] == 1.0 and data["info"]["final_answer"] == "UTC"
    assert _post(service, "/evaluate", instance_id=iid, params={"sparse": True}).json()["data"] == 1.0
    _post(service, "/release", instance_id=iid)


def test_a_tool_error_stays_an_error(service: RunningService) -> None:
    iid = _create(service, "utc-zone")
    response = _call(service, iid, "clock__get_current_time", {"timezone": "Nowhere/Atlantis"})
    assert _tool_text(response).startswith("Error:") and "Nowhere/Atlantis" in _tool_text(response)
    assert response.json()["data"]["info"]["tool_errors"] == 1
    _post(service, "/release", instance_id=iid)


def test_git_per_instance_server_commit_scored_by_the_tool_checker(service: RunningService, repo: Path) -> None:
    (repo / "notes.txt").write_text("remember\n")
    iid = _create(service, "commit-notes")
    assert "Error" not in _tool_text(_call(service, iid, "git_add", {"repo_path": str(repo), "files": ["notes.txt"]}))
    committed = _tool_text(_call(service, iid, "git_commit", {"repo_path": str(repo), "message": "add notes"}))
    assert not committed.startswith("Error"), committed
    data = _answer(service, iid, "FINAL ANSWER: committed")
    assert data["reward"] == 1.0  # the checker called git_log on the episode's own server
    assert len(_server_pids(service, "mcp-server-git")) == 1
    _post(service, "/release", instance_id=iid)
    assert _server_pids(service, "mcp-server-git") == []  # stopped with its instance


def test_a_huge_result_is_cut_with_a_note(service: RunningService, repo: Path) -> None:
    iid = _create(service, "commit-notes")
    text = _tool_text(_call(service, iid, "git_show", {"repo_path": str(repo), "revision": "HEAD~1"}))
    if "big file" not in text:  # HEAD moved by the commit test: find the big commit by message
        text = _tool_text(_call(service, iid, "git_show", {"repo_path": str(repo), "revision": ":/big file"}))
    assert "[result cut:" in text and "max_result_chars" in text
    assert len(text) < 2200
    _post(service, "/release", instance_id=iid)


# ---------------------------------------------------------------------------------------------- faults
@pytest.mark.parametrize(("tool", "arguments", "field"), [
    ("git_log", {}, "arguments.repo_path is required"),
    ("git_log", {"repo_path": ".", "max_count": "ten"}, "arguments.max_count"),
    ("time__get_current_time", {"timezone": 5}, "arguments.timezone"),
])
def test_schema_errors_are_answered_before_the_call(service: RunningService, tool: str, arguments: dict[str, Any],
                                                    field: str) -> None:
    task = "commit-notes" if tool.startswith("git") else "utc-zone"
    iid = _create(service, task)
    response = _call(service, iid, tool, arguments)
    text = _tool_text(response)
    assert text.startswith("Error:") and field in text and "nothing was called" in text
    assert response.json()["data"]["info"]["schema_errors"] == 1
    assert not response.json()["data"]["is_terminated"]
    _post(service, "/release", instance_id=iid)


def test_an_unknown_tool_is_named(service: RunningService) -> None:
    iid = _create(service, "utc-zone")
    text = _tool_text(_call(service, iid, "get_weather", {}))
    assert text.startswith("Error: no tool 'get_weather'") and "time__get_current_time" in text
    _post(service, "/release", instance_id=iid)


def test_a_hanging_tool_is_ended_by_the_time_limit_and_its_server_restarted(service: RunningService,
                                                                              hang_url: str) -> None:
    before = _server_pids(service, "mcp-server-fetch")
    iid = _create(service, "read-slow")
    response = _call(service, iid, "fetch", {"url": hang_url})
    text = _tool_text(response)
    # Only the service's time limit answers so (had the fetch server's own 30 s HTTP timeout ended the call
    # first, the answer would be the fetch tool's error, with no limit or restart named); no wall-clock bound,
    # which a loaded machine could break.
    assert "did not answer within 2 s" in text and "servers.fetch.call_timeout_s" in text and "restarted" in text
    assert response.json()["data"]["info"]["timeouts"] == 1
    # The episode goes on with a fresh server: the next call is answered (a tool error, quickly).
    assert _tool_text(_call(service, iid, "fetch", {"url": "not a url"}))
    # The wedged server is stopped in the background (stdin closed, then SIGTERM, then SIGKILL), so the episode
    # is not held up by it: on a loaded machine it can outlive the next call (CI once saw both pids). Wait for
    # it to go; the guard only ends a hang.
    deadline = time.monotonic() + 120
    while set(_server_pids(service, "mcp-server-fetch")) & set(before) and time.monotonic() < deadline:
        time.sleep(0.2)
    after = _server_pids(service, "mcp-server-fetch")
    assert after and set(after).isdisjoint(before)
    _post(service, "/release", instance_id=iid)
    _healthy(service)


def test_a_server_crash_fails_the_episode_alone_and_the_server_starts_again(service: RunningService,
                                                                            repo: Path) -> None:
    iid = _create(service, "utc-zone")
    other = _create(service, "commit-notes")
    assert "UTC" in _tool_text(_call(service, iid, "time__get_current_time", {"timezone": "UTC"}))
    [pid] = _server_pids(service, "Etc/UTC")
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(pid).wait(timeout=30)
    response = _call(service, iid, "time__get_current_time", {"timezone": "UTC"})
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "instance_failed" and "MCP server 'time'" in error["message"]
    _healthy(service)
    # Another live episode is unaffected; a new episode gets a restarted server.
    assert "branch" in _tool_text(_call(service, other, "git_status", {"repo_path": str(repo)})).lower()
    fresh = _create(service, "utc-zone")
    assert "UTC" in _tool_text(_call(service, fresh, "time__get_current_time", {"timezone": "UTC"}))
    [restarted] = _server_pids(service, "Etc/UTC")
    assert restarted != pid
    # A server that dies between episodes is found dead at /create (ping) and restarted before the episode.
    os.kill(restarted, signal.SIGKILL)
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(restarted).wait(timeout=30)
    later = _create(service, "utc-zone")
    assert "UTC" in _tool_text(_call(service, later, "time__get_current_time", {"timezone": "UTC"}))
    for instance in (iid, other, fresh, later):
        _post(service, "/release", instance_id=instance)


def test_an_unknown_server_is_named(service: RunningService) -> None:
    response = _post(service, "/create", env_type="mcp", task_id="utc-zone", params={"servers": ["weather"]})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "unknown_server" and error["field"] == "params.servers" and "'weather'" in error["message"]
    assert "time, clock, git" in error["message"]
    _healthy(service)


# ---------------------------------------------------------------------------------------------- security
def test_stdio_servers_get_only_the_listed_variables_and_http_works(service: RunningService) -> None:
    iid = _create(service, "probe-env")
    assert _tool_text(_call(service, iid, "probe__getenv", {"name": "SECRET_TOKEN"})) == "<unset>"
    assert _tool_text(_call(service, iid, "probe__getenv", {"name": "PASSED_VAR"})) == "visible"
    assert _tool_text(_call(service, iid, "web__getenv", {"name": "PROBE_SIDE"})) == "http"  # streamable HTTP
    _post(service, "/release", instance_id=iid)


def test_a_server_that_fails_to_start_is_named_with_its_stderr_tail(tmp_path: Path) -> None:
    """mcp-server-sqlite 2025.4.25 uses the 1.x SDK's decorators and dies at start-up under mcp 2.x."""
    config = tmp_path / "servers.yaml"
    config.write_text(f"servers:\n  - name: sqlite\n    command: [mcp-server-sqlite, --db-path, {tmp_path / 'x.db'}]\n")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "env_service" / "env_service.py"), "--env", "mcp",
                             "--port", str(free_port())], capture_output=True, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "AGENTEVOLVER_MCP_CONFIG": str(config)}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "MCP server 'sqlite'" in result.stderr and "failed to start" in result.stderr
    assert "last lines of its stderr" in result.stderr and "AttributeError" in result.stderr
    assert "Traceback" not in result.stderr.split("last lines of its stderr")[0]


def test_an_mcp_sdk_older_than_needed_is_named_at_service_start(tmp_path: Path) -> None:
    """A server that pins the 1.x SDK, pip-installed into the service's venv, downgrades the SDK there; the service
    then says so at start. The downgrade is stood in for by a 1.x distribution record ahead on the path."""
    fake = tmp_path / "site" / "mcp-1.9.4.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: mcp\nVersion: 1.9.4\n")
    config = tmp_path / "servers.yaml"
    config.write_text("servers:\n  - name: time\n    command: [mcp-server-time]\n")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "env_service" / "env_service.py"), "--env", "mcp",
                             "--port", str(free_port())], capture_output=True, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "AGENTEVOLVER_MCP_CONFIG": str(config),
                                 "PYTHONPATH": str(tmp_path / "site")}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "the MCP SDK installed here is mcp 1.9.4; this environment needs mcp>=2.0.0" in result.stderr
    assert "virtualenv of its own" in result.stderr and "python -m venv" in result.stderr
    assert "Traceback" not in result.stderr and "input_schema" not in result.stderr


@pytest.mark.parametrize(("config", "needle"), [
    ({"servers": [{"name": "x"}]}, "servers[0]: Value error, server 'x': give exactly one of command"),
    ({"servers": [{"name": "x", "command": ["no-such-mcp-server"]}]}, "servers[0].command: program"),
    ({"servers": [{"name": "x", "url": "ftp://h"}]}, "url must be http"),
    ({"servers": []}, "servers: List should have at least 1 item"),
    ({"servers": [{"name": "x", "url": "http://h/mcp", "scop": "shared"}]}, "servers[0].scop: Extra inputs"),
])
def test_a_bad_config_names_the_key(tmp_path: Path, config: dict[str, Any], needle: str) -> None:
    from env_service.environments.mcp.config import parse_config
    from env_service.errors import EnvUnavailable

    with pytest.raises(EnvUnavailable) as caught:
        parse_config(config, "MCP config 'c.yaml'")
    assert needle.replace("Value error, ", "") in str(caught.value)


def test_process_isolation_runs_each_instance_and_its_servers_in_a_process_of_its_own(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"servers": [{"name": "time", "command": ["mcp-server-time"]}]}))
    with env_service("mcp", "--isolation", "mcp=process", tmp_path=tmp_path,
                     env={"AGENTEVOLVER_MCP_CONFIG": str(config)}) as running:
        iid = _create(running, "explore-get_current_time")
        assert "UTC" in _tool_text(_call(running, iid, "get_current_time", {"timezone": "UTC"}))
        service = psutil.Process(running.process.pid)
        instance_servers = [p for p in service.children(recursive=True)
                            if "mcp-server-time" in " ".join(p.cmdline()) and p.ppid() != service.pid]
        assert instance_servers  # started by the instance's own process, not by the service
        _post(running, "/release", instance_id=iid)
        assert _answer_after_release(running, iid)


def _answer_after_release(service: RunningService, instance_id: str) -> bool:
    response = _post(service, "/step", instance_id=instance_id, messages={"role": "assistant", "content": "x"})
    return response.status_code == 404
