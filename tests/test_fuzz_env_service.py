"""The environment service fuzzed against its own OpenAPI schema (schemathesis, in process).

The app is built in process (``create_app`` with ``calc`` and the ``echo`` test environment, a bearer
token required) and driven through schemathesis's ASGI transport: per operation ``EXAMPLES`` requests that
fit the schema and ``EXAMPLES`` that break it (12 operations: at most 12 x 2 x 25 = 600 requests, about 20 s
on the 2-core machine). Required of every answer: no 5xx; the status, content type and body as
``/openapi.json`` declares them (``agentevolver/schema/env_answers.py``); every error JSON
``{success: false, data: null, error: {code, message, field}}`` with the field to fix named; bad input
rejected; a request without the token refused.

Half of the schema-fitting requests are pinned to real objects (a served env_type, a real task id, a live
instance, a well-formed action), so the fuzzer gets past "unknown id" into the environments' own code.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st
from schema_fuzz import asgi_schema, fuzz_schema, json_error_names_field, stop_apps

#: Generated requests per operation and mode (positive, negative) in the default suite.
EXAMPLES = 25
TOKEN_ENV = "AGENTEVOLVER_FUZZ_ENV_TOKEN"
TOKEN = "fuzz-token"
LIVE = [f"fuzz-live-{i}" for i in range(4)]
ACTIONS = [
    {"role": "assistant", "content": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "258 / 6"}}'
                                     "\n</tool_call>"},
    {"role": "assistant", "content": "FINAL ANSWER: 43"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "calculator", "arguments": '{"expression": "1 +"}'}}]},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c2", "name": "calculator", "arguments": "[1]"}]},
]


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import envs_for_tests  # noqa: F401 - registers the echo test environment

    from env_service.app import create_app
    from env_service.registry import load_envs
    from env_service.settings import ServiceSettings

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    settings = ServiceSettings(envs=["calc", "echo"], max_instances=64, auth_token_env=TOKEN_ENV)
    yield create_app(settings, load_envs(settings.envs))
    stop_apps()


def _pin(case: Any, data: st.DataObject) -> None:
    """Point half the schema-fitting requests at real environments, tasks, instances and actions."""
    if not data.draw(st.booleans(), label="pin"):
        return
    path = case.operation.path
    if "env_type" in (case.path_parameters or {}):
        case.path_parameters["env_type"] = data.draw(st.sampled_from(["calc", "echo"]), label="env_type")
    if not isinstance(case.body, dict):
        return
    body = case.body
    if "env_type" in body or path in ("/create", "/get_env_profile", "/step_labels"):
        body["env_type"] = data.draw(st.sampled_from(["calc", "echo"]), label="env_type")
    if path in ("/create", "/step_labels"):
        body["task_id"] = data.draw(st.sampled_from(["train-single-000", "val-chain-000", "t1"]), label="task_id")
    if path in ("/step", "/evaluate", "/get_info"):
        body["instance_id"] = data.draw(st.sampled_from(LIVE), label="instance_id")
    if path == "/step":
        body["messages"] = data.draw(st.sampled_from(ACTIONS), label="action")


def test_env_service_answers_every_generated_request_as_its_schema_declares(app: Any) -> None:
    from schemathesis.python import asgi

    headers = {"Authorization": f"Bearer {TOKEN}"}
    with asgi.get_client(app) as client:  # live instances for the pinned requests
        for instance_id in LIVE:
            answer = client.post("/create", headers=headers, json={
                "env_type": "calc", "task_id": "train-single-000", "instance_id": instance_id})
            assert answer.status_code == 200, answer.text
    # 400 capability_unsupported and 422 bad_action/cannot_label: the schema cannot know what an environment can do
    counts = fuzz_schema(asgi_schema(app, domain_rejections=(400, 422)), max_examples=EXAMPLES, headers=headers, pin=_pin,
                         checks=[json_error_names_field(fieldless=["too_many_instances"])])
    assert len(counts) == 13 and all(count >= 1 for count in counts.values()), counts
