"""The reference system's clients against our environment service, through a real uvicorn process.

The request bodies below are the bytes the reference's clients put on the wire (``requests.post(url,
json=data)`` = ``json.dumps`` with its default separators and ASCII escapes), written out from reading its
``env_service/env_client.py``, ``agentevolver/client/env_client.py``, ``env_manager/env_worker.py``,
``agent_flow/agent_flow.py`` and ``env_service/test_script/test_bfcl.py``: ``null`` for ids a route does not
use, ``"env_type": "default"`` on instance routes, hermes ``<tool_call>`` text, the flat ToolCall of its
``test_bfcl.py`` and its ToolCall dump. The answers are checked for what the reference client and trainer
read: ``success``, ``data``, ``data.state`` of exactly [system, user] after ``/create`` and of exactly one
user message after every ``/step``, ``reward`` / ``is_terminated``, a float score. A service that
answered anything else would make the reference client retry and then return its silent fallbacks.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from env_service_fixture import RunningService, env_service
from fastapi import FastAPI
from pydantic import BaseModel

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings
from agentevolver.client.memory_client import MemoryClient, MemoryClientError, MemoryClientSettings
from env_service.environments.calc.tasks import get_task
from env_service.errors import UnknownEnv
from env_service.registry import load_envs

JSON = {"Content-Type": "application/json"}

# ------------------------------------------------------------------------------------------ reference bodies
#: env_service/env_client.py get_env_profile(env_type, split="train").
PROFILE = '{"env_type": "__ENV__", "task_id": null, "instance_id": null, "messages": {}, "params": {"split": "train"}}'
#: test_bfcl.py: create_instance("bfcl", "multi_turn_base_0", params={"model_name": "gt-script"}).
CREATE_BFCL = ('{"env_type": "bfcl", "task_id": "multi_turn_base_0", "instance_id": null, "messages": {}, '
               '"params": {"model_name": "gt-script"}}')
#: env_worker.py: create_instance(env_type, task_id, instance_id=<uuid hex>, params={"is_open_query": ...}).
CREATE_WORKER = ('{"env_type": "__ENV__", "task_id": "__TASK__", "instance_id": "__IID__", "messages": {}, '
                 '"params": {"is_open_query": false}}')
#: create_instance(env_type, task_id) with no instance id and no params.
CREATE_PLAIN = '{"env_type": "__ENV__", "task_id": "__TASK__", "instance_id": null, "messages": {}, "params": {}}'
#: step(instance_id, action): the action goes in "messages"; env_type is the client's "default".
STEP = '{"env_type": "default", "task_id": null, "instance_id": "__IID__", "messages": __ACTION__, "params": {}}'
#: evaluate(instance_id, params={"sparse": ...}) (agent_flow.py, env_grader.py, test_bfcl.py).
EVALUATE_SPARSE = ('{"env_type": "default", "task_id": null, "instance_id": "__IID__", "messages": {}, '
                   '"params": {"sparse": true}}')
EVALUATE_DENSE = ('{"env_type": "default", "task_id": null, "instance_id": "__IID__", "messages": {}, '
                  '"params": {"sparse": false}}')
#: get_tools_info(instance_id) and release_instance(instance_id).
GET_INFO = '{"env_type": "default", "task_id": null, "instance_id": "__IID__", "messages": {}, "params": {}}'
RELEASE = '{"env_type": "default", "task_id": null, "instance_id": "__IID__", "messages": {}, "params": {}}'

# calc task train-single-000 is "Calculate 258 / 6." (asserted below); each action shape asks for 258 / 6.
CALC_TASK = "train-single-000"
CALC_ACTIONS = {
    # agent_flow.py: {"content": <generated text>, "role": "assistant"}
    "hermes_text": r'{"content": "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": '
                   r'\"258 / 6\"}}\n</tool_call>", "role": "assistant"}',
    "openai_tool_calls": r'{"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": '
                         r'"function", "function": {"name": "calculator", "arguments": "{\"expression\": '
                         r'\"258 / 6\"}"}}]}',
    # test_bfcl.py tc(): {id, name, arguments (JSON string), type: "tool", index}
    "flat_tool_call": r'{"role": "assistant", "content": "", "tool_calls": [{"id": "calculator_1_0", "name": '
                      r'"calculator", "arguments": "{\"expression\": \"258 / 6\"}", "type": "tool", "index": 0}]}',
    # trajectory.py ToolCall.simple_dict: {id, <type>: {arguments, name}, type, index, result}
    "tool_call_dump": r'{"role": "assistant", "content": "", "tool_calls": [{"id": "calculator_1_0", "tool": '
                      r'{"arguments": "{\"expression\": \"258 / 6\"}", "name": "calculator"}, "type": "tool", '
                      r'"index": 0, "result": null}]}',
}
CALC_FINAL = '{"content": "FINAL ANSWER: 43", "role": "assistant"}'

# codebox task reverse_words, submitted through the submit tool in each shape.
CODEBOX_TASK = "reverse_words"
CODEBOX_ACTIONS = {
    "hermes_text": r'''{"content": "I will submit.\n<tool_call>\n{\"name\": \"submit\", \"arguments\": {\"code\": '''
                   r'''\"def reverse_words(sentence):\\n    return ' '.join(sentence.split()[::-1])\\n\"}}\n</tool_call>", '''
                   r'''"role": "assistant"}''',
    "openai_tool_calls": r'''{"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc", "type": '''
                         r'''"function", "function": {"name": "submit", "arguments": "{\"code\": \"def '''
                         r'''reverse_words(sentence):\\n    return ' '.join(sentence.split()[::-1])\\n\"}"}}]}''',
    "flat_tool_call": r'''{"role": "assistant", "content": "", "tool_calls": [{"id": "submit_1_0", "name": "submit", '''
                      r'''"arguments": "{\"code\": \"def reverse_words(sentence):\\n    return ' '.join('''
                      r'''sentence.split()[::-1])\\n\"}", "type": "tool", "index": 0}]}''',
    "tool_call_dump": r'''{"role": "assistant", "content": "", "tool_calls": [{"id": "submit_1_0", "tool": '''
                      r'''{"arguments": "{\"code\": \"def reverse_words(sentence):\\n    return ' '.join('''
                      r'''sentence.split()[::-1])\\n\"}", "name": "submit"}, "type": "tool", "index": 0, '''
                      r'''"result": null}]}''',
}
CODEBOX_RUN = (r'{"content": "<tool_call>\n{\"name\": \"run_python\", \"arguments\": {\"code\": \"print(6 * 7)\"}}'
               r'\n</tool_call>", "role": "assistant"}')

# test_bfcl.py ASSISTANT_MESSAGES: the ground truth of multi_turn_base_0 as hermes text, and "ok" replies.
BFCL_GROUND_TRUTH = [
    r'{"role": "assistant", "content": "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"document\"}}'
    r'\n</tool_call>\n<tool_call>\n{\"name\": \"mkdir\", \"arguments\": {\"dir_name\": \"temp\"}}\n</tool_call>\n'
    r'<tool_call>\n{\"name\": \"mv\", \"arguments\": {\"source\": \"final_report.pdf\", \"destination\": \"temp\"}}'
    r'\n</tool_call>"}',
    r'{"role": "assistant", "content": "ok.1"}',
    r'{"role": "assistant", "content": "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"temp\"}}\n'
    r'</tool_call>\n<tool_call>\n{\"name\": \"grep\", \"arguments\": {\"file_name\": \"final_report.pdf\", '
    r'\"pattern\": \"budget analysis\"}}\n</tool_call>"}',
    r'{"role": "assistant", "content": "ok.2"}',
    r'{"role": "assistant", "content": "<tool_call>\n{\"name\": \"sort\", \"arguments\": {\"file_name\": '
    r'\"final_report.pdf\"}}\n</tool_call>"}',
    r'{"role": "assistant", "content": "ok.2"}',
    r'{"role": "assistant", "content": "<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"..\"}}\n'
    r'</tool_call>\n<tool_call>\n{\"name\": \"mv\", \"arguments\": {\"source\": \"previous_report.pdf\", '
    r'\"destination\": \"temp\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": '
    r'\"temp\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"diff\", \"arguments\": {\"file_name1\": '
    r'\"final_report.pdf\", \"file_name2\": \"previous_report.pdf\"}}\n</tool_call>"}',
    r'{"role": "assistant", "content": "ok.2"}',
]
#: test_bfcl.py's other message (mkdir temp; cd temp -- not what turn 1 asks), as requests escapes it.
BFCL_WRONG_TURN = (r'{"role": "assistant", "content": "\u6211\u6765\u5e2e\u4f60\u67e5\u4e00\u4e0b\u3002\n'
                   r'<tool_call>\n{\"name\": \"mkdir\", \"arguments\": {\"dir_name\": \"temp\"}}\n</tool_call>\n'
                   r'<tool_call>\n{\"name\": \"cd\", \"arguments\": {\"folder\": \"temp\"}}\n</tool_call>"}')
#: The ground truth's turn 1 in the flat ToolCall shape of test_bfcl.py's tc() helper.
BFCL_TURN1_FLAT = (r'{"role": "assistant", "content": "", "tool_calls": [{"id": "cd_1_0", "name": "cd", "arguments": '
                   r'"{\"folder\": \"document\"}", "type": "tool", "index": 0}, {"id": "mkdir_1_1", "name": "mkdir", '
                   r'"arguments": "{\"dir_name\": \"temp\"}", "type": "tool", "index": 1}, {"id": "mv_1_2", "name": '
                   r'"mv", "arguments": "{\"source\": \"final_report.pdf\", \"destination\": \"temp\"}", "type": '
                   r'"tool", "index": 2}]}')


def _body(template: str, **values: str) -> bytes:
    for key, value in values.items():
        template = template.replace(f"__{key.upper()}__", value)
    json.loads(template)  # the literal must be valid JSON (a typo here would test nothing)
    return template.encode()


def _post(service: RunningService, route: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{service.url}{route}", content=body, headers=JSON, timeout=120)


def _ok(response: httpx.Response) -> Any:
    """What the reference client reads: a 200 (it calls raise_for_status) with ``success`` and ``data``."""
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True, body
    return body["data"]


def _create(service: RunningService, template: str, **values: str) -> tuple[str, list[dict[str, Any]]]:
    data = _ok(_post(service, "/create", _body(template, **values)))
    state = data["state"]
    # env_worker.py asserts exactly two opening messages, the last one the user query.
    assert isinstance(state, list) and [m["role"] for m in state] == ["system", "user"], state
    assert all(isinstance(m["content"], str) for m in state)
    assert isinstance(data["info"]["instance_id"], str) and data["info"]["instance_id"]
    return data["info"]["instance_id"], state


def _step(service: RunningService, iid: str, action: str) -> dict[str, Any]:
    data = _ok(_post(service, "/step", _body(STEP, iid=iid, action=action)))
    # agent_flow.py asserts exactly one observation message; a non-tool one is used as is.
    assert set(data) >= {"state", "reward", "is_terminated", "info"}
    assert len(data["state"]) == 1 and data["state"][0]["role"] == "user", data["state"]
    assert isinstance(data["state"][0]["content"], str)
    assert isinstance(data["reward"], int | float) and isinstance(data["is_terminated"], bool)
    return data


def _evaluate(service: RunningService, iid: str, template: str = EVALUATE_SPARSE) -> float:
    score = _ok(_post(service, "/evaluate", _body(template, iid=iid)))
    assert isinstance(score, int | float)
    return float(score)


def _release(service: RunningService, iid: str) -> dict[str, Any]:
    response = _post(service, "/release", _body(RELEASE, iid=iid))
    assert response.status_code == 200, response.text  # the reference client reads success from a 200
    return response.json()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    servable = ["echo"]
    for env in ("calc", "codebox", "bfcl"):
        try:
            load_envs([env])
            servable.append(env)
        except (ImportError, UnknownEnv):
            continue
    with env_service(",".join(servable), tmp_path=tmp_path_factory.mktemp("refcompat")) as running:
        yield running


def _served(service: RunningService, env: str) -> None:
    if env not in {e["env_type"] for e in httpx.get(f"{service.url}/envs").json()["data"]}:
        pytest.skip(f"{env} is not servable here (bfcl needs scripts/install_extras.sh)")


# ---------------------------------------------------------------------------------------- every route
@pytest.mark.parametrize("env", ["calc", "codebox", "bfcl"])
def test_profile_with_null_ids(service: RunningService, env: str) -> None:
    _served(service, env)
    task_ids = _ok(_post(service, "/get_env_profile", _body(PROFILE, env=env)))
    assert task_ids and all(isinstance(t, str) for t in task_ids)


@pytest.mark.parametrize("shape", sorted(CALC_ACTIONS))
def test_calc_episode_in_every_action_shape(service: RunningService, shape: str) -> None:
    assert get_task(CALC_TASK).query == "Calculate 258 / 6."
    iid, state = _create(service, CREATE_PLAIN, env="calc", task=CALC_TASK)
    # the demonstrations and the tools travel in the system message, the question is the user message
    assert "calculator" in state[0]["content"] and "<tools>" in state[0]["content"]
    assert "FINAL ANSWER: 372" in state[0]["content"] and state[1]["content"] == "Calculate 258 / 6."
    computed = _step(service, iid, CALC_ACTIONS[shape])
    assert computed["state"][0]["content"] == "<tool_response>\n43\n</tool_response>"
    assert not computed["is_terminated"] and computed["reward"] == 0.0
    final = _step(service, iid, CALC_FINAL)
    assert final["is_terminated"] and final["reward"] == 1.0
    assert final["state"][0]["content"] == "[CONVERSATION_COMPLETED]"
    assert _evaluate(service, iid) == 1.0
    assert _ok(_post(service, "/get_info", _body(GET_INFO, iid=iid)))["task_id"] == CALC_TASK
    assert _release(service, iid) == {"success": True, "data": True}


def test_worker_create_with_a_client_chosen_id(service: RunningService) -> None:
    iid, _ = _create(service, CREATE_WORKER, env="calc", task=CALC_TASK, iid="a3f1c0de9b8e4d2f8a6b5c4d3e2f1a0b")
    assert iid == "a3f1c0de9b8e4d2f8a6b5c4d3e2f1a0b"
    nudged = _step(service, iid, '{"content": "Let me think.", "role": "assistant"}')
    assert "FINAL ANSWER" in nudged["state"][0]["content"] and not nudged["is_terminated"]
    assert _release(service, iid)["success"] is True


@pytest.mark.parametrize("shape", sorted(CODEBOX_ACTIONS))
def test_codebox_episode_in_every_action_shape(service: RunningService, shape: str) -> None:
    iid, state = _create(service, CREATE_PLAIN, env="codebox", task=CODEBOX_TASK)
    assert "run_python" in state[0]["content"] and "reverse_words" in state[1]["content"]
    ran = _step(service, iid, CODEBOX_RUN)
    assert "42" in ran["state"][0]["content"] and ran["state"][0]["content"].startswith("<tool_response>")
    submitted = _step(service, iid, CODEBOX_ACTIONS[shape])
    assert submitted["is_terminated"] and submitted["reward"] == 1.0
    assert _evaluate(service, iid) == 1.0 and _evaluate(service, iid, EVALUATE_DENSE) == 1.0
    assert _release(service, iid)["success"] is True


def test_codebox_explains_an_unreadable_tool_call(service: RunningService) -> None:
    iid, _ = _create(service, CREATE_PLAIN, env="codebox", task=CODEBOX_TASK)
    broken = _step(service, iid, r'{"content": "<tool_call>{\"name\": \"submit\", \"arguments\": {code}}</tool_call>",'
                                 r' "role": "assistant"}')
    assert "could not be read" in broken["state"][0]["content"] and not broken["is_terminated"]
    _release(service, iid)


# ---------------------------------------------------------------------------------------- BFCL ground truth
def _bfcl_episode(service: RunningService, actions: list[str]) -> tuple[str, list[dict[str, Any]]]:
    iid, state = _create(service, CREATE_BFCL)
    assert "<tools>" in state[0]["content"] and '"name": "mkdir"' in state[0]["content"]
    assert "final_report.pdf" in state[1]["content"]
    steps = []
    for action in actions:
        steps.append(_step(service, iid, action))
        if steps[-1]["is_terminated"]:
            break
    return iid, steps


def test_bfcl_ground_truth_of_the_reference_script_scores_one(service: RunningService) -> None:
    _served(service, "bfcl")
    iid, steps = _bfcl_episode(service, BFCL_GROUND_TRUTH)
    assert len(steps) == len(BFCL_GROUND_TRUTH) and steps[-1]["is_terminated"]
    assert [s["is_terminated"] for s in steps[:-1]] == [False] * (len(steps) - 1)
    assert steps[0]["state"][0]["content"].count("<tool_response>") == 3  # three calls ran in turn 1
    assert "budget analysis" in steps[1]["state"][0]["content"]  # "ok.1" ended turn 1: turn 2's question
    assert steps[-1]["reward"] == 1.0
    assert _evaluate(service, iid) == 1.0
    assert _evaluate(service, iid, EVALUATE_DENSE) == 1.0
    assert _release(service, iid) == {"success": True, "data": True}


def test_bfcl_flat_tool_calls_score_like_hermes_text(service: RunningService) -> None:
    _served(service, "bfcl")
    iid, steps = _bfcl_episode(service, [BFCL_TURN1_FLAT, *BFCL_GROUND_TRUTH[1:]])
    assert steps[-1]["is_terminated"] and _evaluate(service, iid) == 1.0
    _release(service, iid)


def test_bfcl_wrong_trajectory_scores_below_one(service: RunningService) -> None:
    _served(service, "bfcl")
    iid, steps = _bfcl_episode(service, [BFCL_WRONG_TURN, *BFCL_GROUND_TRUTH[1:]])
    assert steps[-1]["is_terminated"]
    assert _evaluate(service, iid) < 1.0 and _evaluate(service, iid, EVALUATE_DENSE) < 1.0
    _release(service, iid)


# ---------------------------------------------------------------------------------------- our shape
def test_native_shape_is_chosen_by_a_parameter(service: RunningService) -> None:
    created = _ok(_post(service, "/create", _body(
        '{"env_type": "calc", "task_id": "__TASK__", "params": {"shape": "native"}}', task=CALC_TASK)))
    iid, state = created["info"]["instance_id"], created["state"]
    assert len(state) == 2 + 8 * 4 and state[1]["role"] == "user" and state[2]["tool_calls"]
    two_calls = _ok(_post(service, "/step", _body(
        r'{"instance_id": "__IID__", "params": {"shape": "native"}, "messages": {"role": "assistant", "content": "",'
        r' "tool_calls": [{"id": "a", "type": "function", "function": {"name": "calculator", "arguments": '
        r'{"expression": "258 / 6"}}}, {"id": "b", "name": "calculator", "arguments": "{\"expression\": \"1 + 1\"}",'
        r' "type": "tool", "index": 1}]}}', iid=iid)))
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in two_calls["state"]] == [
        ("tool", "a", "43"), ("tool", "b", "2")]
    final = _ok(_post(service, "/step", _body(
        '{"instance_id": "__IID__", "params": {"shape": "native"}, "messages": ' + CALC_FINAL + "}", iid=iid)))
    assert final["state"] == [] and final["is_terminated"]
    bad = _post(service, "/step", _body('{"instance_id": "__IID__", "params": {"shape": "full"}, "messages": '
                                        + CALC_FINAL + "}", iid=iid))
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "params.shape"
    _release(service, iid)


def test_env_client_asks_for_the_native_shape(service: RunningService) -> None:
    with EnvClient(EnvClientSettings(env_url=service.url, timeout_s=60)) as client:
        created = client.create("calc", CALC_TASK)
        assert len(created.state) == 34
        iid = created.info.instance_id
        step = client.step(iid, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "2*3"}}}]})
        assert [(m.role, m.tool_call_id, m.content) for m in step.state] == [("tool", "x", "6")]
        assert client.release(iid) is True


# ---------------------------------------------------------------------------------------- release and errors
def test_releasing_nothing_is_success_false(service: RunningService, caplog: pytest.LogCaptureFixture) -> None:
    unknown = _release(service, "never-created")
    assert unknown["success"] is False and unknown["error"]["field"] == "instance_id"
    assert unknown["error"]["code"] == "unknown_instance" and "nothing to release" in unknown["error"]["message"]
    iid, _ = _create(service, CREATE_PLAIN, env="echo", task="t1")
    assert _release(service, iid)["success"] is True
    assert _release(service, iid)["success"] is False  # a second release releases nothing
    with EnvClient(EnvClientSettings(env_url=service.url, timeout_s=30)) as client, caplog.at_level(logging.WARNING):
        assert client.release(iid) is False
        assert client.stats["retries"] == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/create", '{"env_type": "calc", "task_id": null, "instance_id": null, "messages": {}, "params": {}}',
         "task_id"),
        ("/create", '{"env_type": null, "task_id": "t1", "instance_id": null, "messages": {}, "params": {}}',
         "env_type"),
        ("/step", '{"env_type": "default", "task_id": null, "instance_id": null, "messages": {"role": "assistant", '
                  '"content": "x"}, "params": {}}', "instance_id"),
        ("/step", '{"env_type": "default", "task_id": null, "instance_id": "x", "messages": {"role": "assistant", '
                  '"tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}, "params": {}}',
         "messages.tool_calls.0.function.name"),
        ("/step", '{"env_type": "default", "task_id": null, "instance_id": "x", "messages": {"role": "assistant", '
                  '"content": ["x"]}, "params": {}}', "messages.content"),
        ("/evaluate", '{"env_type": "default", "task_id": null, "instance_id": null, "messages": {}, '
                      '"params": {"sparse": true}}', "instance_id"),
    ],
)
def test_invalid_body_is_a_4xx_naming_the_field(service: RunningService, route: str, body: str, field: str) -> None:
    response = _post(service, route, _body(body))
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["field"] == field and error["message"].startswith(field), error
    for dump in ("input_value", "errors.pydantic.dev", "validation error for", "Traceback"):
        assert dump not in response.text


def test_env_client_errors_carry_the_service_message_and_field(service: RunningService) -> None:
    with EnvClient(EnvClientSettings(env_url=service.url, timeout_s=30, max_retries=0)) as client:
        with pytest.raises(EnvClientError) as missing:
            client.create("calc", "")
        assert missing.value.field == "task_id" and missing.value.status == 422
        assert str(missing.value).startswith("environment service rejected /create: task_id is required")
        iid = client.create("calc", CALC_TASK).info.instance_id
        with pytest.raises(EnvClientError) as bad:
            client.step(iid, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]})
        assert bad.value.code == "bad_action" and bad.value.field == "messages.tool_calls.0.function.name"
        assert str(bad.value).startswith("environment service rejected /step: messages.tool_calls.0.function.name: ")
        assert "HTTP 422 bad_action" in str(bad.value)
        client.release(iid)


class _Query(BaseModel):
    query: str
    top_k: int


@pytest.fixture(scope="module")
def fastapi_default_errors() -> Iterator[str]:
    """A server answering FastAPI's default 422 ``detail`` body, as a real ReMe server does."""
    app = FastAPI()

    @app.post("/retrieve_task_memory")
    async def retrieve(body: _Query) -> dict[str, Any]:
        return {"success": True, "answer": "", "metadata": {}}

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_memory_client_errors_carry_the_service_message_and_field(fastapi_default_errors: str) -> None:
    settings = MemoryClientSettings(base_url=fastapi_default_errors, max_retries=0, timeout_s=10)
    with MemoryClient(settings) as client, pytest.raises(MemoryClientError) as err:
        client.retrieve("w", "q")  # no top_k: the server's model requires one
    assert err.value.field == "top_k" and err.value.status == 422
    assert str(err.value).startswith("memory service rejected /retrieve_task_memory: top_k: Field required")
