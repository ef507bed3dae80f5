"""Typed answers and one body per client operation (issue 47).

The services' routes return their pydantic answer models (validated on the way out), the clients parse the
same models, and each client operation is written once and driven by both the sync and the async method.
The wire itself is checked by the reference-compat, service and fuzz tests; here: every route is typed, a
bad answer fails loudly on either side, and the sync and async forms of an operation send the same requests
and handle failures alike.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.routing import APIRoute

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings
from agentevolver.schema import env_answers, memory_wire


def _routes(router: Any) -> dict[str, APIRoute]:
    return {f"{sorted(r.methods)[0]} {r.path}": r for r in router.routes if isinstance(r, APIRoute)}


def test_every_env_route_returns_an_answer_model() -> None:
    from env_service.routes import router

    routes = _routes(router)
    untyped = [label for label, route in routes.items()
               if route.response_model is None or route.response_model.__module__ != env_answers.__name__]
    assert untyped == [] and len(routes) == 12


def test_every_memory_route_but_the_export_stream_returns_its_model() -> None:
    from agentevolver.memory_service.routes import router

    routes = _routes(router)
    untyped = [label for label, route in routes.items() if label != "GET /workspaces/{workspace_id}/export" and (
        route.response_model is None or route.response_model.__module__ != memory_wire.__name__)]
    assert untyped == [] and len(routes) == 7


class CannedEnvClient(EnvClient):
    """An EnvClient whose transport answers from a script: each answer a body, or an exception to raise."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__(EnvClientSettings(env_url="http://canned", max_retries=0))
        self.answers, self.sent = list(answers), []

    def _next(self, method: str, route: str, json: Any = None, **_: Any) -> Any:
        self.sent.append((method, route, (json or {}).get("instance_id")))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _send(self, method: str, route: str, *, idempotent: bool, **options: Any) -> Any:
        return self._next(method, route, **options)

    async def _asend(self, method: str, route: str, *, idempotent: bool, **options: Any) -> Any:
        await asyncio.sleep(0)
        return self._next(method, route, **options)


CREATED = {"success": True, "data": {"state": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                     "info": {"instance_id": "i1", "task_id": "t1"}}}
FAILED_502 = EnvClientError("environment service failed on /create", status=502, code="instance_failed")


def _both(answers: list[Any], call: Any) -> list[tuple[Any, list[Any]]]:
    """``call(client, sync)`` run on a fresh canned client per form: (result or error, requests sent)."""
    results = []
    for sync in (True, False):
        client = CannedEnvClient(answers)
        try:
            result = call(client, True) if sync else asyncio.run(call(client, False))
        except EnvClientError as err:
            result = f"EnvClientError: {err}"
        results.append((result, client.sent))
    return results


@pytest.mark.parametrize(("answers", "expect_sent"), [
    ([CREATED], [("POST", "/create", "i1")]),
    # a 5xx: the instance may exist server-side, so release it and create once more
    ([FAILED_502, {"success": True, "data": True}, CREATED],
     [("POST", "/create", "i1"), ("POST", "/release", "i1"), ("POST", "/create", "i1")]),
])
def test_create_is_one_operation_for_the_sync_and_the_async_method(answers: list[Any],
                                                                  expect_sent: list[Any]) -> None:
    def create(client: EnvClient, sync: bool) -> Any:
        return client.create("echo", "t1", instance_id="i1") if sync else client.acreate("echo", "t1", instance_id="i1")

    (sync_result, sync_sent), (async_result, async_sent) = _both(answers, create)
    assert sync_result == async_result and sync_result.info.instance_id == "i1"
    assert sync_sent == async_sent == expect_sent


def test_step_failures_are_handled_alike_in_both_forms() -> None:
    lost = EnvClientError("gone", status=410, code="instance_gone")
    bad_action = EnvClientError("bad", status=422, code="bad_action", field="messages.role")

    def step(client: EnvClient, sync: bool) -> Any:
        action = {"role": "assistant", "content": "x"}
        return client.step("i1", action) if sync else client.astep("i1", action)

    (sync_result, _), (async_result, _) = _both([lost], step)
    assert sync_result == async_result and sync_result.is_terminated and sync_result.info["instance_lost"]
    (sync_result, _), (async_result, _) = _both([bad_action], step)
    assert sync_result == async_result == "EnvClientError: bad"


def test_an_answer_that_is_not_its_routes_model_raises_naming_the_route_and_model() -> None:
    malformed = {"success": True, "data": {"state": "not a list", "info": {"instance_id": "i1", "task_id": "t1"}}}

    def create(client: EnvClient, sync: bool) -> Any:
        return client.create("echo", "t1", instance_id="i1") if sync else client.acreate("echo", "t1", instance_id="i1")

    for result, _ in _both([malformed], create):
        assert isinstance(result, str) and "http://canned/create: the answer is not a CreateAnswer" in result


def test_release_of_nothing_is_false_in_both_forms() -> None:
    unknown = EnvClientError("nothing to release", status=200, code="unknown_instance", field="instance_id")

    def release(client: EnvClient, sync: bool) -> Any:
        return client.release("i1") if sync else client.arelease("i1")

    assert [result for result, _ in _both([unknown], release)] == [False, False]
    assert [result for result, _ in _both([{"success": True, "data": True}], release)] == [True, True]
