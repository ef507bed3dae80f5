"""The memory client's failure policy, against a scripted HTTP server that fails on purpose.

The happy paths run against the real service in tests/test_memory_service.py; here a small FastAPI app
(served by uvicorn on a free port: real HTTP) answers each route from a per-test script of statuses, so
which failures are retried -- and which are not, because a repeat could store an experience twice -- is
pinned down exactly.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from agentevolver.client.memory_client import MemoryClient, MemoryClientError, MemoryClientSettings

_RETRIEVED = {"success": True, "answer": "Experience 1 (applies when: w)\nc", "metadata": {"memory_list": [
    {"workspace_id": "w", "memory_id": "m1", "memory_type": "task", "when_to_use": "w", "content": "c",
     "score": 0.9, "time_created": "2026-01-01 00:00:00", "time_modified": "2026-01-01 00:00:00",
     "author": "x", "metadata": {}, "similarity": 0.8}]}}


class FlakyService:
    """Answers POST/GET routes with planned statuses first, then 200 with a canned ReMe-shaped body."""

    def __init__(self) -> None:
        self.plans: dict[str, deque[int]] = {}
        self.calls: list[tuple[str, Any]] = []
        app = FastAPI()

        @app.api_route("/{route:path}", methods=["GET", "POST"])
        async def any_route(route: str, request: Request) -> JSONResponse:
            body = await request.json() if request.method == "POST" else None
            self.calls.append((f"/{route}", body))
            plan = self.plans.get(f"/{route}")
            if plan:
                status = plan.popleft()
                return JSONResponse(status_code=status, content={"success": False, "answer": "", "metadata": {},
                                    "error": {"code": f"scripted_{status}", "message": "scripted failure",
                                              "field": "top_k" if status == 422 else None}})
            if route == "retrieve_task_memory":
                return JSONResponse(_RETRIEVED)
            if route == "summary_task_memory":
                return JSONResponse({"success": True, "answer": "stored 0", "metadata": {}})
            return JSONResponse({"success": True, "answer": "", "metadata": {"action_result": []}})

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def plan(self, route: str, *statuses: int) -> None:
        self.plans[route] = deque(statuses)

    def client(self, **overrides: Any) -> MemoryClient:
        values = {"base_url": f"http://127.0.0.1:{self.port}", "timeout_s": 10.0, "max_retries": 3,
                  "backoff_initial_s": 0.0, "backoff_max_s": 0.0} | overrides
        return MemoryClient(MemoryClientSettings(**values))


@pytest.fixture(scope="module")
def flaky_server() -> Iterator[FlakyService]:
    service = FlakyService()
    service.thread.start()
    while not service.server.started:
        time.sleep(0.01)
    yield service
    service.server.should_exit = True
    service.thread.join(timeout=10)


@pytest.fixture
def flaky(flaky_server: FlakyService) -> FlakyService:
    flaky_server.plans.clear()
    flaky_server.calls.clear()
    return flaky_server


TRAJECTORY = {"messages": [{"role": "user", "content": "do it"}], "score": 1.0}


def test_retrieve_retries_5xx_and_overload_then_parses_the_reme_answer(flaky: FlakyService):
    flaky.plan("/retrieve_task_memory", 503, 502, 500)
    with flaky.client() as client:
        answer = client.retrieve("w", "a task", top_k=2)
        assert client.stats == {"requests": 4, "retries": 3}
    assert answer.metadata.memory_list[0].similarity == 0.8 and answer.answer.startswith("Experience 1")
    assert flaky.calls[-1][1] == {"workspace_id": "w", "query": "a task", "top_k": 2}


def test_summary_is_not_repeated_after_it_may_have_been_processed(flaky: FlakyService):
    flaky.plan("/summary_task_memory", 502)
    with flaky.client() as client, pytest.raises(MemoryClientError) as err:
        client.summary("w", [TRAJECTORY])
    assert err.value.status == 502 and err.value.code == "scripted_502"
    assert len(flaky.calls) == 1


def test_summary_is_retried_when_the_service_says_it_did_not_process_it(flaky: FlakyService):
    flaky.plan("/summary_task_memory", 429, 503)
    with flaky.client() as client:
        assert client.summary("w", [TRAJECTORY]).answer == "stored 0"
    assert len(flaky.calls) == 3
    assert flaky.calls[0][1] == {"workspace_id": "w", "trajectories": [
        {"task_id": "", "messages": [{"role": "user", "content": "do it"}], "score": 1.0, "metadata": {}}]}


def test_client_errors_are_raised_at_once_with_code_and_field(flaky: FlakyService):
    flaky.plan("/retrieve_task_memory", 422)
    with flaky.client() as client, pytest.raises(MemoryClientError) as err:
        client.retrieve("w", "q")
    assert (err.value.status, err.value.code, err.value.field) == (422, "scripted_422", "top_k")
    assert len(flaky.calls) == 1


def test_retries_run_out_with_a_message_that_says_so(flaky: FlakyService):
    flaky.plan("/vector_store", 503, 503, 503)
    with flaky.client(max_retries=2) as client, pytest.raises(MemoryClientError, match="gave up after 3 attempts"):
        client.list_memories("w")


def test_unreachable_service_is_retried_then_reported():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    client = MemoryClient(MemoryClientSettings(base_url=f"http://127.0.0.1:{port}", max_retries=1,
                                               backoff_initial_s=0.0, backoff_max_s=0.0))
    with client, pytest.raises(MemoryClientError, match=r"ConnectError.*gave up after 2 attempts"):
        client.retrieve("w", "q")
    assert not client.healthy()


def test_bad_arguments_fail_in_the_caller_before_any_request(flaky: FlakyService):
    with flaky.client() as client:
        with pytest.raises(ValueError, match="workspace_id"):
            client.retrieve("../w", "q")
        with pytest.raises(ValueError, match="score"):
            client.summary("w", [{"messages": [{"role": "user", "content": "x"}]}])
    assert flaky.calls == []


async def test_async_retrieve_retries_like_the_sync_one(flaky: FlakyService):
    flaky.plan("/retrieve_task_memory", 503)
    client = flaky.client()
    try:
        answer = await client.aretrieve("w", "q")
    finally:
        await client.aclose()
    assert answer.metadata.memory_list[0].memory_id == "m1" and len(flaky.calls) == 2


def test_settings_from_the_trainer_memory_section():
    settings = MemoryClientSettings.from_config({"base_url": "http://127.0.0.1:8001", "workspace_id": "x",
                                                 "retrieve_top_k": 3})
    assert settings.base_url == "http://127.0.0.1:8001" and settings.max_retries == 3
