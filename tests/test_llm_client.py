"""The shared OpenAI-compatible client, against a real HTTP server playing scripted replies.

No wall-clock assertions: the machines are shared and sometimes slow. Concurrency is checked with the
server's in-flight gate (``hold_until_in_flight``) rather than with sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError
from tenacity import RetryCallState

from agentevolver.client import LLMClient, LLMClients, LLMConfig, LLMEndpointConfig, client_for_role
from agentevolver.client.llm_client import PLACEHOLDER_API_KEY
from agentevolver.client.retry import FullJitterBackoff, RetryableFailure, retry_after_s
from agentevolver.errors import ConfigError, LLMError

# tests/ is a plain directory on sys.path under pytest's default import mode; with a tests/__init__.py the
# repo root is on sys.path instead. (A bare `import tests` can also hit the `tests` package verl installs.)
try:
    from scripted_openai_server import (
        SCRIPTED_API_KEY_ENV,
        SCRIPTED_MODEL,
        Reply,
        ScriptedOpenAIServer,
        scripted_llm,
    )
except ModuleNotFoundError:
    from tests.scripted_openai_server import (  # type: ignore[no-redef]
        SCRIPTED_API_KEY_ENV,
        SCRIPTED_MODEL,
        Reply,
        ScriptedOpenAIServer,
        scripted_llm,
    )

__all__ = ["scripted_llm"]  # re-exported fixture: keeps it visible to pytest without a conftest

REPO_ROOT = Path(__file__).resolve().parents[1]
HELLO = [{"role": "user", "content": "say hello"}]
SECRET = "sk-test-secret-123"


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(SCRIPTED_API_KEY_ENV, SECRET)
    return SECRET


def _endpoint_dict(**overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"base_url": "http://127.0.0.1:8010/v1", "model": "some-model"}
    values.update(overrides)
    return values


# ---------------------------------------------------------------------------------------------- config


def test_shipped_yaml_llm_section_validates() -> None:
    """The lead's config/agentevolver.yaml and these models must not drift apart."""
    path = REPO_ROOT / "config" / "agentevolver.yaml"
    if not path.exists():
        pytest.skip("config/agentevolver.yaml not present")
    node = OmegaConf.load(path).llm
    config = LLMConfig.model_validate(OmegaConf.to_container(node, resolve=True))
    assert config.roles, "the shipped config routes no role"
    for role in config.roles:
        name, endpoint = config.endpoint_for(role)
        assert name in config.endpoints
        assert endpoint.base_url.startswith(("http://", "https://"))


def test_endpoint_defaults_and_normalisation() -> None:
    endpoint = LLMEndpointConfig(**_endpoint_dict(base_url="https://example.test/v1/"))
    assert endpoint.base_url == "https://example.test/v1"
    assert endpoint.api_key_env == "AGENTEVOLVER_LLM_API_KEY"
    assert endpoint.max_retries == 3
    assert endpoint.max_concurrency == 8


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"timeout_s": -1.0}, "timeout_s"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"base_url": "127.0.0.1:8010/v1"}, "base_url"),
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"api_key_env": "sk-abc-123"}, "api_key_env"),
        ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ({"temprature": 0.5}, "temprature"),
    ],
)
def test_endpoint_validation_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        LLMEndpointConfig(**_endpoint_dict(**overrides))
    assert field in str(info.value)


def test_role_naming_unknown_endpoint_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        LLMConfig(endpoints={"local": _endpoint_dict()}, roles={"judge": "vllm"})
    message = str(info.value)
    assert "llm.roles.judge" in message
    assert "local" in message


def test_unknown_key_in_llm_section_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        LLMConfig(endpoints={"local": _endpoint_dict()}, roles={}, role={"judge": "local"})
    assert "role" in str(info.value)


def test_unknown_role_names_role_and_known_roles() -> None:
    config = LLMConfig(
        endpoints={"local": _endpoint_dict()}, roles={"judge": "local", "task_grader": "local"}
    )
    with pytest.raises(ConfigError) as info:
        client_for_role(config, "jduge")
    message = str(info.value)
    assert "jduge" in message
    assert "judge" in message
    assert "task_grader" in message


def test_for_role_accepts_a_hydra_node() -> None:
    node = OmegaConf.create({"endpoints": {"vllm": _endpoint_dict(model="m1")}, "roles": {"judge": "vllm"}})
    client = LLMClient.for_role(node, "judge")
    assert client.name == "vllm"
    assert client.model == "m1"


# ---------------------------------------------------------------------------------------------- success


def test_sync_chat_sends_config_and_key(scripted_llm: ScriptedOpenAIServer, api_key: str) -> None:
    scripted_llm.plan("hello there")
    with LLMClient(scripted_llm.endpoint(temperature=0.3, max_tokens=77)) as client:
        result = client.chat(HELLO, stop=["\n"], top_p=0.9)
    assert result.text == "hello there"
    assert result.finish_reason == "stop"
    assert result.attempts == 1
    assert result.model == SCRIPTED_MODEL
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (2, 2)
    assert result.usage.total_tokens == 4
    [request] = scripted_llm.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == SCRIPTED_MODEL
    assert request.body["messages"] == HELLO
    assert request.body["temperature"] == 0.3
    assert request.body["max_tokens"] == 77
    assert request.body["stop"] == ["\n"]
    assert request.body["top_p"] == 0.9
    assert request.headers["authorization"] == f"Bearer {api_key}"


def test_call_arguments_override_endpoint_defaults(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan("x")
    LLMClient(scripted_llm.endpoint()).chat(HELLO, temperature=1.2, max_tokens=5)
    body = scripted_llm.bodies[0]
    assert (body["temperature"], body["max_tokens"]) == (1.2, 5)
    assert "stop" not in body


def test_unset_key_env_sends_placeholder(
    scripted_llm: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCRIPTED_API_KEY_ENV, raising=False)
    scripted_llm.plan("ok")
    LLMClient(scripted_llm.endpoint()).chat(HELLO)
    assert scripted_llm.requests[0].headers["authorization"] == f"Bearer {PLACEHOLDER_API_KEY}"


async def test_async_chat(scripted_llm: ScriptedOpenAIServer, api_key: str) -> None:
    scripted_llm.plan("async hello")
    async with LLMClient(scripted_llm.endpoint(max_tokens=9)) as client:
        result = await client.achat(HELLO, temperature=0.5)
    assert result.text == "async hello"
    assert result.attempts == 1
    [request] = scripted_llm.requests
    assert request.body["model"] == SCRIPTED_MODEL
    assert request.body["messages"] == HELLO
    assert (request.body["temperature"], request.body["max_tokens"]) == (0.5, 9)
    assert request.headers["authorization"] == f"Bearer {api_key}"


async def test_sync_chat_works_inside_a_running_event_loop(scripted_llm: ScriptedOpenAIServer) -> None:
    """Sync callers live inside event loops (verl's agent loop, FastAPI handlers): ``chat`` must neither start a
    loop nor need one (the reason chat and achat share one operation run by two drivers, not an async core)."""
    scripted_llm.plan(Reply.error(503), "from inside a loop")
    asyncio.get_running_loop()  # there is one
    result = LLMClient(scripted_llm.endpoint(max_retries=1)).chat(HELLO)
    assert (result.text, result.attempts) == ("from inside a loop", 2)


async def test_an_async_backoff_leaves_the_event_loop_running(scripted_llm: ScriptedOpenAIServer) -> None:
    """A retry's backoff is awaited, so other coroutines on the loop run while it waits."""
    # Retry-After (1 s) capped by backoff_max_s: a 0.5 s wait, not a jittered one
    scripted_llm.plan(Reply.error(429, "slow down", headers={"retry-after": "1"}), "after the backoff")
    endpoint = scripted_llm.endpoint(max_retries=1, backoff_initial_s=0.5, backoff_max_s=0.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        result = await LLMClient(endpoint).achat(HELLO)
    finally:
        task.cancel()
    assert result.text == "after the backoff"
    assert ticks >= 5  # the loop kept running through the backoff


def test_empty_messages_is_a_caller_error(scripted_llm: ScriptedOpenAIServer) -> None:
    with pytest.raises(ValueError, match="messages"):
        LLMClient(scripted_llm.endpoint()).chat([])
    assert scripted_llm.requests == []


# ---------------------------------------------------------------------------------------------- retries


def test_5xx_retried_then_success(
    scripted_llm: ScriptedOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    scripted_llm.plan(Reply.error(500), Reply.error(503), "hello")
    with caplog.at_level(logging.INFO, logger="agentevolver.client.llm_client"):
        result = LLMClient(scripted_llm.endpoint(max_retries=2)).chat(HELLO)
    assert result.text == "hello"
    assert result.attempts == 3
    assert len(scripted_llm.requests) == 3
    assert "attempt 1/3 failed (HTTP 500" in caplog.text


async def test_429_retried_async(scripted_llm: ScriptedOpenAIServer) -> None:
    # Retry-After is honoured but capped by backoff_max_s (0 here), so the test does not wait.
    scripted_llm.plan(Reply.error(429, "slow down", headers={"retry-after": "30"}), "done")
    result = await LLMClient(scripted_llm.endpoint(max_retries=1)).achat(HELLO)
    assert (result.text, result.attempts) == ("done", 2)


def test_retries_exhausted_names_endpoint_attempts_and_last_error(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(*[Reply.error(502, "bad gateway")] * 3, "never reached")
    client = LLMClient.for_role(scripted_llm.llm_config(max_retries=2), "judge")
    with pytest.raises(LLMError) as info:
        client.chat(HELLO)
    message = str(info.value)
    assert "3 attempt(s)" in message
    assert "HTTP 502" in message
    assert scripted_llm.base_url in message
    assert SCRIPTED_MODEL in message
    assert "llm.endpoints.scripted" in message
    assert isinstance(info.value.__cause__, openai.APIStatusError)
    assert len(scripted_llm.requests) == 3
    assert scripted_llm.pending_replies == 1


@pytest.mark.parametrize(
    "malformed",
    [
        Reply.empty_choices(),
        Reply.raw(""),
        Reply.raw("{}"),
        Reply.raw("null"),
        Reply.raw("{truncated"),
        Reply.raw("plain text", content_type="text/plain"),
    ],
    ids=["empty-choices", "empty-body", "empty-object", "null", "truncated-json", "text-plain"],
)
def test_malformed_200_is_retried(scripted_llm: ScriptedOpenAIServer, malformed: Reply) -> None:
    scripted_llm.plan(malformed, "fine")
    result = LLMClient(scripted_llm.endpoint(max_retries=1)).chat(HELLO)
    assert (result.text, result.attempts) == ("fine", 2)


def test_malformed_200_exhausted_is_llm_error(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(Reply.empty_choices(), Reply.empty_choices())
    with pytest.raises(LLMError, match=r"2 attempt\(s\).*without choices"):
        LLMClient(scripted_llm.endpoint(max_retries=1)).chat(HELLO)


def test_timeout_retried_then_llm_error(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(Reply.hang(3.0), Reply.hang(3.0), "not reached")
    client = LLMClient(scripted_llm.endpoint(timeout_s=0.5, max_retries=1))
    with pytest.raises(LLMError) as info:
        client.chat(HELLO)
    message = str(info.value)
    assert "2 attempt(s)" in message
    assert "timeout_s=0.5" in message
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert len(scripted_llm.requests) == 2


async def test_timeout_then_success_async(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(Reply.hang(3.0), "second try")
    result = await LLMClient(scripted_llm.endpoint(timeout_s=0.5, max_retries=1)).achat(HELLO)
    assert (result.text, result.attempts) == ("second try", 2)


def test_connection_refused_is_retried_then_llm_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on once the socket is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = LLMEndpointConfig(
        base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=2, backoff_initial_s=0, backoff_max_s=0
    )
    with pytest.raises(LLMError, match=r"3 attempt\(s\).*could not connect"):
        LLMClient(endpoint).chat(HELLO)


# ---------------------------------------------------------------------------------------------- non-retryable


def test_401_fails_at_once_and_says_which_env_var(
    scripted_llm: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCRIPTED_API_KEY_ENV, raising=False)
    scripted_llm.plan(Reply.error(401, "invalid api key"), "not reached")
    with pytest.raises(LLMError) as info:
        LLMClient(scripted_llm.endpoint(max_retries=3)).chat(HELLO)
    message = str(info.value)
    assert f"set the env var {SCRIPTED_API_KEY_ENV}" in message
    assert scripted_llm.base_url in message
    assert SCRIPTED_MODEL in message
    assert isinstance(info.value.__cause__, openai.AuthenticationError)
    assert len(scripted_llm.requests) == 1


def test_401_with_key_set_never_echoes_the_key(scripted_llm: ScriptedOpenAIServer, api_key: str) -> None:
    scripted_llm.plan(Reply.error(401))
    with pytest.raises(LLMError) as info:
        LLMClient(scripted_llm.endpoint()).chat(HELLO)
    assert SCRIPTED_API_KEY_ENV in str(info.value)
    assert api_key not in str(info.value)


async def test_404_fails_at_once_and_points_at_model_and_base_url(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(Reply.error(404, "model not found"), "not reached")
    client = LLMClient.for_role(scripted_llm.llm_config(max_retries=3), "task_grader")
    with pytest.raises(LLMError) as info:
        await client.achat(HELLO)
    message = str(info.value)
    assert "llm.endpoints.scripted.model" in message
    assert "llm.endpoints.scripted.base_url" in message
    assert "model not found" in message
    assert len(scripted_llm.requests) == 1


@pytest.mark.parametrize("status", [400, 403, 422])
def test_other_client_errors_fail_at_once(scripted_llm: ScriptedOpenAIServer, status: int) -> None:
    scripted_llm.plan(Reply.error(status), "not reached")
    with pytest.raises(LLMError, match=f"HTTP {status}"):
        LLMClient(scripted_llm.endpoint(max_retries=3)).chat(HELLO)
    assert len(scripted_llm.requests) == 1


# ---------------------------------------------------------------------------------------------- concurrency


def _gated(body: Any) -> Reply:
    # Hold each reply until 3 requests were in flight together (at most 5 s): deterministic, not timed.
    return Reply.answer("ok", hold_until_in_flight=3, delay_s=5.0)


async def test_async_concurrency_limit(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.respond_with(_gated)
    async with LLMClient(scripted_llm.endpoint(max_concurrency=3)) as client:
        results = await asyncio.gather(*(client.achat(HELLO) for _ in range(20)))
    assert [r.text for r in results] == ["ok"] * 20
    assert len(scripted_llm.requests) == 20
    assert scripted_llm.max_in_flight == 3  # concurrent (> 1), and never above the limit


def test_sync_concurrency_limit_across_threads(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.respond_with(_gated)
    with LLMClient(scripted_llm.endpoint(max_concurrency=3)) as client, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: client.chat(HELLO), range(20)))
    assert [r.text for r in results] == ["ok"] * 20
    assert scripted_llm.max_in_flight == 3


async def test_cancelled_achat_releases_its_slot(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(Reply.hang(30.0), "after")
    client = LLMClient(scripted_llm.endpoint(max_concurrency=1))
    task = asyncio.create_task(client.achat(HELLO))
    for _ in range(2000):  # until the request reached the server (bounded, so a bug cannot hang the run)
        if scripted_llm.requests:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await client.achat(HELLO)).text == "after"  # the only slot was given back
    await client.aclose()


def test_unplanned_request_fails_loudly(scripted_llm: ScriptedOpenAIServer) -> None:
    """The test double answers 418 (not retried) when a test forgot to plan a reply."""
    with pytest.raises(LLMError, match="no reply planned"):
        LLMClient(scripted_llm.endpoint()).chat(HELLO)
    assert len(scripted_llm.requests) == 1


def test_roles_on_one_endpoint_share_one_client(scripted_llm: ScriptedOpenAIServer) -> None:
    with LLMClients(scripted_llm.llm_config()) as clients:
        assert clients.for_role("judge") is clients.for_role("exp_summarizer")
        with pytest.raises(ConfigError, match="nope"):
            clients.for_role("nope")


# ---------------------------------------------------------------------------------------------- lifecycle


def test_same_client_across_two_asyncio_runs(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan("first", "second", "third")
    client = LLMClient(scripted_llm.endpoint())
    assert asyncio.run(client.achat(HELLO)).text == "first"
    assert asyncio.run(client.achat(HELLO)).text == "second"
    assert client.chat(HELLO).text == "third"  # the sync side is independent of any loop
    client.close()


def test_client_reopens_after_close(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan("a", "b", "c")
    client = LLMClient(scripted_llm.endpoint())
    assert client.chat(HELLO).text == "a"
    client.close()
    assert client.chat(HELLO).text == "b"

    async def twice() -> str:
        await client.aclose()
        return (await client.achat(HELLO)).text

    assert asyncio.run(twice()) == "c"


def test_client_pickles_without_its_pools(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan("before", "after")
    client = LLMClient(scripted_llm.endpoint(), name="scripted")
    client.chat(HELLO)
    copy = pickle.loads(pickle.dumps(client))
    assert copy.endpoint == client.endpoint
    assert copy.name == "scripted"
    assert copy.chat(HELLO).text == "after"


# ---------------------------------------------------------------------------------------------- policy units


def _retry_state(attempt: int, failure: BaseException) -> RetryCallState:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = attempt
    state.set_exception((type(failure), failure, None))
    return state


def test_backoff_is_full_jitter_and_capped() -> None:
    wait = FullJitterBackoff(initial_s=0.5, max_s=4.0)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (6, 4.0)]:
        delays = [wait(_retry_state(attempt, RetryableFailure("x"))) for _ in range(50)]
        assert all(0.0 <= d <= ceiling for d in delays)


def test_backoff_honours_retry_after_up_to_the_cap() -> None:
    wait = FullJitterBackoff(initial_s=0.0, max_s=4.0)
    assert wait(_retry_state(1, RetryableFailure("429", retry_after_s=2.0))) == 2.0
    assert wait(_retry_state(1, RetryableFailure("429", retry_after_s=60.0))) == 4.0


def test_retry_after_parsing() -> None:
    assert retry_after_s({"Retry-After": "3"}) == 3.0
    assert retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a past date
    assert retry_after_s({"retry-after": "soon"}) is None
    assert retry_after_s({}) is None
