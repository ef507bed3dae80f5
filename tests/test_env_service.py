"""The environment service through a real uvicorn process, driven by EnvClient and by raw HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from env_service_fixture import REPO_ROOT, RunningService, env_service

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings


def _client(url: str, **overrides: object) -> EnvClient:
    settings = {"env_url": url, "timeout_s": 30.0, "max_retries": 2, "backoff_initial_s": 0.05,
                "backoff_max_s": 0.2, **overrides}
    return EnvClient(EnvClientSettings(**settings))  # type: ignore[arg-type]


def _wait_until(predicate, what: str, attempts: int = 300, pause_s: float = 0.1) -> None:
    """Poll a condition a bounded number of times (no wall-clock assertion on the machine's speed)."""
    for _ in range(attempts):
        if predicate():
            return
        time.sleep(pause_s)
    raise AssertionError(f"condition never held: {what}")


def _env_children(service: RunningService) -> list[psutil.Process]:
    """Live instance processes of the service: the children of its multiprocessing fork server."""
    servers = [p for p in psutil.Process(service.process.pid).children() if "forkserver" in " ".join(p.cmdline())]
    return [c for server in servers for c in server.children()
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    with env_service("echo,echo_process", "--max-instances", "80",
                     tmp_path=tmp_path_factory.mktemp("svc")) as running:
        yield running


@pytest.fixture(scope="module")
def hang_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    """A short call timeout, for the tests whose instances hang on purpose: 10 s, so the create of a process
    instance (a fresh Python) fits in it even on a loaded machine (3 s did not, with the suite on every core)."""
    with env_service("echo,echo_process", "--call-timeout", "10", "--max-instances", "80",
                     tmp_path=tmp_path_factory.mktemp("hang")) as running:
        yield running


# ----------------------------------------------------------------------------------------------- basics
def test_health_docs_and_environment_listing(service: RunningService) -> None:
    assert httpx.get(f"{service.url}/healthz").text == "OK"
    assert httpx.get(f"{service.url}/docs").status_code == 200
    spec = httpx.get(f"{service.url}/openapi.json").json()
    assert {"/create", "/step", "/evaluate", "/get_info", "/release", "/get_env_profile"} <= set(spec["paths"])
    with _client(service.url) as client:
        envs = {e["env_type"]: e for e in client.list_envs()}
        assert envs["echo"]["isolation"] == "inline" and envs["echo_process"]["isolation"] == "process"
        assert client.get_env_profile("echo", "val") == ["t8", "t9"]
        assert client.tools("echo") is None


@pytest.mark.parametrize("env_type", ["echo", "echo_process"])
def test_full_episode_through_the_client(service: RunningService, env_type: str) -> None:
    with _client(service.url) as client:
        created = client.create(env_type, "t1")
        iid = created.info.instance_id
        assert [m.role for m in created.state] == ["system", "user"]
        first = client.step(iid, {"role": "assistant", "content": "hello"})
        assert first.state[0].content == "echo: hello" and not first.is_terminated
        assert client.evaluate(iid, sparse=False) == 0.5
        last = client.step(iid, {"role": "assistant", "content": "bye"})
        assert last.is_terminated and last.info["steps"] == 2
        assert client.evaluate(iid) == 1.0
        assert client.get_info(iid)["task_id"] == "t1"
        assert client.release(iid) is True
        assert client.release(iid) is False


def test_raw_wire_format_matches_the_reference(service: RunningService) -> None:
    body = {"env_type": "echo", "task_id": "t2", "instance_id": "raw-1", "messages": {}, "params": {}}
    created = httpx.post(f"{service.url}/create", json=body).json()
    assert created["success"] is True and created["data"]["info"]["instance_id"] == "raw-1"
    step = httpx.post(f"{service.url}/step", json={**body, "messages": {"role": "assistant", "content": "bye"}}).json()
    assert set(step["data"]) == {"state", "reward", "is_terminated", "info"}
    score = httpx.post(f"{service.url}/evaluate", json={**body, "params": {"sparse": True}}).json()
    assert score == {"success": True, "data": 1.0}
    assert httpx.post(f"{service.url}/release", json=body).json() == {"success": True, "data": True}


# ----------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("route", "payload", "status", "field"),
    [
        ("/create", {"env_type": "echo"}, 422, "task_id"),
        ("/create", {"task_id": "t1"}, 422, "env_type"),
        ("/create", {"env_type": "nope", "task_id": "t1"}, 404, "env_type"),
        ("/create", {"env_type": "echo", "task_id": "t99"}, 404, "task_id"),
        ("/create", {"env_type": "echo", "task_id": 5}, 422, "task_id"),
        ("/create", {"env_type": "echo", "task_id": "t1", "tsk": 1}, 422, "tsk"),
        ("/step", {"instance_id": "missing", "messages": {"role": "assistant", "content": "x"}}, 404, "instance_id"),
        ("/step", {"messages": {"role": "assistant", "content": "x"}}, 422, "instance_id"),
        ("/step", {"instance_id": "x", "messages": []}, 422, "messages"),
        ("/evaluate", {"instance_id": "missing"}, 404, "instance_id"),
        ("/get_info", {}, 422, "instance_id"),
        ("/get_env_profile", {"env_type": "echo", "params": {"split": "nope"}}, 404, "params.split"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(service: RunningService, route: str, payload: dict, status: int,
                                              field: str) -> None:
    response = httpx.post(f"{service.url}{route}", json=payload)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is False and body["error"]["field"] == field, body
    assert "Traceback" not in response.text


def test_bad_action_and_bad_params_on_a_live_instance(service: RunningService) -> None:
    with _client(service.url) as client:
        iid = client.create("echo", "t3").info.instance_id
        wrong_role = httpx.post(f"{service.url}/step", json={"instance_id": iid,
                                                             "messages": {"role": "user", "content": "x"}})
        assert wrong_role.status_code == 422 and wrong_role.json()["error"]["field"] == "messages.role"
        with pytest.raises(EnvClientError) as info:
            client.step(iid, {"role": "user", "content": "x"})
        assert info.value.code == "bad_action"
        bad_sparse = httpx.post(f"{service.url}/evaluate", json={"instance_id": iid, "params": {"sparse": "yes"}})
        assert bad_sparse.status_code == 400 and bad_sparse.json()["error"]["field"] == "params.sparse"
        client.release(iid)


def test_invalid_json_and_oversized_bodies(service: RunningService) -> None:
    invalid = httpx.post(f"{service.url}/create", content=b"{not json", headers={"content-type": "application/json"})
    assert invalid.status_code == 400 and invalid.json()["error"]["field"] == "body"
    huge = {"env_type": "echo", "task_id": "t1", "params": {"blob": "x" * (5 * 1024 * 1024)}}
    too_big = httpx.post(f"{service.url}/create", json=huge)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "body_too_large"


# ----------------------------------------------------------------------------------------------- isolation
def test_a_crashing_instance_fails_alone(service: RunningService) -> None:
    with _client(service.url) as client:
        victim = client.create("echo_process", "t1").info.instance_id
        bystander = client.create("echo_process", "t2").info.instance_id
        crashed = client.step(victim, {"role": "assistant", "content": "crash"})
        assert crashed.info["fallback"] is True and crashed.info["instance_lost"] is True and crashed.is_terminated
        assert "exit code 13" in crashed.info["error"]
        again = httpx.post(f"{service.url}/step", json={"instance_id": victim,
                                                        "messages": {"role": "assistant", "content": "x"}})
        assert again.status_code == 410 and again.json()["error"]["code"] == "instance_gone"
        assert client.step(bystander, {"role": "assistant", "content": "still here"}).state[0].content == \
            "echo: still here"
        assert client.release(victim) and client.release(bystander)
    assert httpx.get(f"{service.url}/healthz").text == "OK"


@pytest.mark.parametrize("env_type", ["echo", "echo_process"])
def test_a_hanging_instance_times_out_alone(hang_service: RunningService, env_type: str) -> None:
    service = hang_service
    with _client(service.url) as client:
        victim = client.create(env_type, "t1").info.instance_id
        bystander = client.create(env_type, "t2").info.instance_id
        raw = httpx.post(f"{service.url}/step", json={"instance_id": victim,
                                                      "messages": {"role": "assistant", "content": "hang"}},
                         timeout=60)
        assert raw.status_code == 504 and raw.json()["error"]["code"] == "instance_timeout"
        assert client.step(bystander, {"role": "assistant", "content": "ok"}).state[0].content == "echo: ok"
        assert client.release(victim) and client.release(bystander)


def test_an_instance_that_raises_returns_an_error_without_a_traceback(service: RunningService) -> None:
    with _client(service.url) as client:
        iid = client.create("echo", "t4").info.instance_id
        raw = httpx.post(f"{service.url}/step", json={"instance_id": iid,
                                                      "messages": {"role": "assistant", "content": "raise"}})
        assert raw.status_code == 502
        assert "RuntimeError: the environment has a bug" in raw.json()["error"]["message"]
        assert "Traceback" not in raw.text
        client.release(iid)


def test_released_process_instances_leave_no_process(service: RunningService) -> None:
    with _client(service.url) as client:
        ids = [client.create("echo_process", f"t{i}").info.instance_id for i in range(4)]
        pids = {client.step(i, {"role": "assistant", "content": "x"}).info["pid"] for i in ids}
        assert len(pids) == 4 and os.getpid() not in pids
        for iid in ids:
            client.release(iid)
    _wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                for p in pids), "instance processes exited")
    assert _env_children(service) == []


# ----------------------------------------------------------------------------------------------- scale
def test_64_concurrent_episodes(service: RunningService) -> None:
    async def episode(client: EnvClient, n: int) -> float:
        env_type = "echo" if n % 2 else "echo_process"
        created = await client.acreate(env_type, f"t{n % 10}")
        iid = created.info.instance_id
        for word in ("a", "b", "bye"):
            await client.astep(iid, {"role": "assistant", "content": word})
        score = await client.aevaluate(iid)
        assert await client.arelease(iid)
        return score

    async def main() -> list[float]:
        async with _client(service.url) as client:
            return await asyncio.gather(*(episode(client, n) for n in range(64)))

    assert asyncio.run(main()) == [1.0] * 64
    stats = httpx.get(f"{service.url}/stats").json()["data"]
    assert stats["live_instances"] == 0


# ----------------------------------------------------------------------------------------------- limits
def test_limits_idle_reaping_and_auth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with env_service("echo", "--max-instances", "3", "--idle-timeout", "1", "--reap-interval", "0.2",
                     "--auth-token-env", "TEST_ENV_TOKEN", tmp_path=tmp_path,
                     env={"TEST_ENV_TOKEN": "s3cret"}) as running:
        assert httpx.get(f"{running.url}/healthz").text == "OK"  # health needs no token
        denied = httpx.post(f"{running.url}/create", json={"env_type": "echo", "task_id": "t1"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
        monkeypatch.setenv("TEST_ENV_TOKEN", "s3cret")
        client = _client(running.url, max_retries=0, auth_token_env="TEST_ENV_TOKEN")
        ids = [client.create("echo", "t1").info.instance_id for _ in range(3)]
        with pytest.raises(EnvClientError) as full:
            client.create("echo", "t1")
        assert full.value.status == 429 and full.value.code == "too_many_instances"
        _wait_until(lambda: client._request("GET", "/stats", None, True)["live_instances"] == 0,
                    "idle instances reaped")
        reaped = client.step(ids[0], {"role": "assistant", "content": "x"})
        assert reaped.info["instance_lost"] is True
        assert client.create("echo", "t1").info.instance_id  # capacity is back
        client.close()


def test_shutdown_releases_every_instance(tmp_path: Path) -> None:
    with env_service("echo_process", "--log-level", "info", tmp_path=tmp_path) as running:
        with _client(running.url) as client:
            for i in range(3):
                client.create("echo_process", f"t{i}")
        _wait_until(lambda: len(_env_children(running)) == 3, "three instance processes")
        children = psutil.Process(running.process.pid).children(recursive=True)
        running.process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal: exit status -SIGTERM
        assert running.process.wait(timeout=120) in (0, -signal.SIGTERM)
    assert "released 3 live instance(s)" in running.log()
    _wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
                "no process of the service left")


def test_the_client_falls_back_when_the_service_is_down() -> None:
    client = _client("http://127.0.0.1:9", max_retries=1)
    result = client.step("any", {"role": "assistant", "content": "x"})
    assert result.info["fallback"] is True and result.is_terminated is False
    assert client.stats["retries"] == 1 and client.stats["step_fallbacks"] == 1
    with pytest.raises(EnvClientError, match="gave up after 2 attempts"):
        client.get_env_profile("echo")
    assert client.healthy() is False


def test_cli_rejects_an_unknown_environment_without_a_traceback() -> None:
    result = subprocess.run([sys.executable, "env_service/env_service.py", "--env", "nope"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "no environment 'nope'" in result.stderr and "Traceback" not in result.stderr


def test_ray_actor_isolation_serves_an_episode(tmp_path: Path) -> None:
    """The reference's one-actor-per-instance design, kept selectable (and benchmarked)."""
    with env_service("echo", "--isolation", "echo=ray", tmp_path=tmp_path) as running, _client(running.url) as client:
        iid = client.create("echo", "t1").info.instance_id
        step = client.step(iid, {"role": "assistant", "content": "bye"})
        assert step.is_terminated and step.info["pid"] != running.process.pid
        assert client.evaluate(iid) == 1.0 and client.release(iid)


def test_many_hanging_process_instances_do_not_block_the_others(hang_service: RunningService) -> None:
    """Waiting on hung instances parks no worker thread: a bystander is answered while eight calls hang."""
    service = hang_service

    async def main() -> None:
        async with _client(service.url, timeout_s=60) as client:
            victims = [(await client.acreate("echo_process", "t1")).info.instance_id for _ in range(8)]
            bystander = (await client.acreate("echo_process", "t2")).info.instance_id
            hanging = [asyncio.ensure_future(client.astep(v, {"role": "assistant", "content": "hang"}))
                       for v in victims]
            await asyncio.sleep(0.5)
            answered = await client.astep(bystander, {"role": "assistant", "content": "ping"})
            assert answered.state[0].content == "echo: ping"
            assert not any(task.done() for task in hanging)
            results = await asyncio.gather(*hanging)
            assert all(r.info["instance_lost"] for r in results)
            for iid in [*victims, bystander]:
                await client.arelease(iid)

    asyncio.run(main())


def test_cli_refuses_an_environment_that_cannot_run_here() -> None:
    """AppWorld without its package/data: a start-up error with the install steps, not a 5xx per request."""
    pytest.importorskip("env_service.environments.appworld")
    try:
        import appworld  # noqa: F401

        pytest.skip("appworld is installed here")
    except ImportError:
        pass
    result = subprocess.run([sys.executable, "env_service/env_service.py", "--env", "appworld"], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "environment 'appworld' cannot be served" in result.stderr and "Traceback" not in result.stderr
