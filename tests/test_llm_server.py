"""The local OpenAI-compatible LLM server, through its real entry point.

Every HTTP test runs against ``python -m agentevolver.llm_server --model tiny-test`` started as a
subprocess on a free port, and talks to it with the project's ``LLMClient``, the official ``openai`` SDK
or raw httpx. No wall-clock assertions: batching is checked with the generator's own counters (``/stats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from ports import free_port

from agentevolver.client import LLMClient, LLMEndpointConfig
from agentevolver.errors import LLMError

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-test"
HELLO = [{"role": "user", "content": "say hello"}]
KEY_ENV = "TEST_LLM_SERVER_KEY"



@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT (no /v1)
    process: subprocess.Popen[str]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stats(self, **headers: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}/stats", headers=headers, timeout=30).json()


@contextlib.contextmanager
def llm_server(log_dir: Path, *extra: str, model: str = MODEL, env: dict[str, str] | None = None,
               ready_deadline_s: float = 600.0) -> Iterator[Server]:
    """Run the server as a subprocess; yield once ``/healthz`` answers; SIGTERM it afterwards."""
    port = free_port()
    log_path = log_dir / f"llm_server_{port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "agentevolver.llm_server", "--model", model, "--port", str(port), *extra],
            cwd=REPO_ROOT, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, text=True,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + ready_deadline_s  # a readiness guard against hangs, not a speed check
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llm server exited with {process.returncode}:\n{server.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/healthz", timeout=2).text == "OK":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"llm server not ready after {ready_deadline_s} s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with llm_server(tmp_path_factory.mktemp("llm_server")) as running:
        yield running


@pytest.fixture
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
    yield client
    client.close()


def _endpoint(server: Server, **overrides: Any) -> LLMEndpointConfig:
    settings: dict[str, Any] = {"timeout_s": 600, "max_retries": 0, **overrides}
    return LLMEndpointConfig(base_url=server.base_url, model=MODEL, **settings)


# -- health, models, the project's client ---------------------------------------------------------------------


def test_health_and_model_list(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").text == "OK"
    models = httpx.get(f"{server.base_url}/models").json()
    assert [card["id"] for card in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == 4096  # tiny-test's max_position_embeddings


def test_llm_client_chats_sync_and_async(server: Server) -> None:
    with LLMClient(_endpoint(server, max_tokens=8), name="local") as client:
        result = client.chat(HELLO, temperature=0)
        assert isinstance(result.text, str) and result.attempts == 1
        assert result.finish_reason in ("stop", "length")
        assert result.model == MODEL
        assert result.usage.prompt_tokens > 0 and 0 < result.usage.completion_tokens <= 8

        async def both() -> list[Any]:
            return await asyncio.gather(client.achat(HELLO, temperature=0), client.achat(HELLO, temperature=0))

        again = asyncio.run(both())
        assert [r.text for r in again] == [result.text, result.text]  # greedy: deterministic


def test_llm_client_reports_a_bad_request_without_retrying(server: Server) -> None:
    client = LLMClient(_endpoint(server, max_retries=3, max_tokens=100_000), name="local")
    with client, pytest.raises(LLMError) as info:
        client.chat(HELLO)
    message = str(info.value)
    assert "HTTP 400" in message and "max_tokens (100000)" in message and "max_model_len 4096" in message


def test_config_local_endpoint_points_at_the_servers_defaults() -> None:
    """`llm.endpoints.local` in the root config must address what `--model smollm2-135m-instruct` serves."""
    from agentevolver.llm_server.__main__ import _parser

    config = yaml.safe_load((REPO_ROOT / "config" / "agentevolver.yaml").read_text())
    local = config["llm"]["endpoints"]["local"]
    defaults = _parser().parse_args(["--model", local["model"]])
    assert local["base_url"] == f"http://{defaults.host}:{defaults.port}/v1"
    assert local["model"] == "smollm2-135m-instruct"  # served name = --model value


# -- the openai SDK ------------------------------------------------------------------------------------------


def test_openai_sdk_chat_n_seed_logprobs_usage(sdk: openai.OpenAI) -> None:
    def ask() -> Any:
        return sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "be brief"}, *HELLO], max_tokens=6, n=3,
            temperature=0.9, seed=7, logprobs=True,
        )

    first, second = ask(), ask()
    texts = [choice.message.content for choice in first.choices]
    assert [choice.index for choice in first.choices] == [0, 1, 2]
    assert texts == [choice.message.content for choice in second.choices]  # same seed: same samples
    assert len(set(texts)) > 1  # choice i samples with seed + i, so the choices differ
    assert first.usage.completion_tokens == 3 * 6  # the random model never says EOS within 6 tokens
    for choice in first.choices:
        assert choice.finish_reason == "length"
        tokens = choice.logprobs.content
        assert len(tokens) == 6 and all(t.logprob <= 0 and t.top_logprobs == [] for t in tokens)
        assert "".join(t.token for t in tokens) == choice.message.content
        assert all(bytes(t.bytes) == t.token.encode() for t in tokens)


def test_max_completion_tokens_and_developer_role(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "developer", "content": "x"}, {"role": "user", "content": [
            {"type": "text", "text": "two "}, {"type": "text", "text": "parts"}]}],
        max_completion_tokens=3, temperature=0,
    )
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"


def test_stop_string_cuts_the_reply(sdk: openai.OpenAI) -> None:
    def greedy(**kwargs: Any) -> Any:
        return sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0,
                                           logprobs=True, **kwargs).choices[0]

    full = greedy().message.content
    stop = full[len(full) // 2: len(full) // 2 + 3]
    cut = greedy(stop=[stop])
    assert cut.message.content == full[: full.find(stop)]
    assert cut.finish_reason == "stop"
    # log-probs cover the whole tokens of the returned text (a token the cut splits is left out)
    assert cut.message.content.startswith("".join(t.token for t in cut.logprobs.content))


def test_streaming_sends_the_same_reply_as_events(sdk: openai.OpenAI) -> None:
    plain = sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0)
    stream = sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, temperature=0, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == plain.usage.total_tokens


def test_text_completions(sdk: openai.OpenAI, server: Server) -> None:
    reply = sdk.completions.create(model=MODEL, prompt=["one two", "three"], max_tokens=4, n=2, temperature=0,
                                   logprobs=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text == reply.choices[1].text  # greedy, same prompt
    assert reply.usage.completion_tokens == 16
    assert reply.choices[0].logprobs.tokens and len(reply.choices[0].logprobs.token_logprobs) == 4
    ids = httpx.post(f"{server.base_url}/completions",
                     json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}, timeout=600).json()
    assert ids["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


# -- tools ---------------------------------------------------------------------------------------------------

ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


def test_tools_and_tool_turns_are_rendered(sdk: openai.OpenAI) -> None:
    plain = sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1)
    with_tools = sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=1, tools=[ADD_TOOL])
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the schema is in the prompt
    replay = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}]
    reply = sdk.chat.completions.create(model=MODEL, messages=replay, max_tokens=1, tools=[ADD_TOOL])
    assert reply.usage.prompt_tokens > with_tools.usage.prompt_tokens


def test_tool_calls_in_a_reply_become_message_tool_calls() -> None:
    """The reply-shaping step on its own: a random model does not write tool calls on demand."""
    from openai.types import CompletionUsage

    from agentevolver.llm_server.engine import Choice
    from agentevolver.llm_server.replies import chat_response
    from agentevolver.module.tools.parsing import get_parser

    usage = CompletionUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    reply = chat_response(MODEL, [Choice(text, "stop", 9, None)], usage, get_parser("hermes"), [ADD_TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls
    assert call.function.name == "add" and call.function.arguments == '{"a": 1, "b": 2}' and call.id
    broken = chat_response(MODEL, [Choice("<tool_call>{oops</tool_call>", "stop", 9, None)], usage,
                           get_parser("hermes"), [ADD_TOOL])
    assert broken.choices[0].message.content == "<tool_call>{oops</tool_call>"  # raw text back, as vLLM does
    assert broken.choices[0].finish_reason == "stop" and not broken.choices[0].message.tool_calls


# -- batching ------------------------------------------------------------------------------------------------


def test_concurrent_requests_are_decoded_together(server: Server) -> None:
    before = server.stats()["generator"]

    async def burst() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
        async with client:
            return await asyncio.gather(*(
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}],
                                               max_tokens=64, temperature=0, extra_body={"ignore_eos": True})
                for i in range(6)
            ))

    replies = asyncio.run(burst())
    after = server.stats()["generator"]
    assert all(r.usage.completion_tokens == 64 for r in replies)
    rows, batches = after["rows"] - before["rows"], after["batches"] - before["batches"]
    assert rows == 6
    assert batches < rows  # some requests shared a decode
    assert after["max_rows"] >= 2


def test_n_choices_share_one_batch(server: Server) -> None:
    before = server.stats()["generator"]
    httpx.post(f"{server.base_url}/chat/completions",
               json={"model": MODEL, "messages": HELLO, "max_tokens": 4, "n": 4}, timeout=600).raise_for_status()
    after = server.stats()["generator"]
    assert after["rows"] - before["rows"] == 4 and after["batches"] - before["batches"] == 1


# -- bad requests --------------------------------------------------------------------------------------------

CHAT = {"model": MODEL, "messages": HELLO, "max_tokens": 4}


@pytest.mark.parametrize(
    ("route", "body", "status", "param", "says"),
    [
        ("chat", {**CHAT, "temperature": -1}, 400, "temperature", "greater than or equal to 0"),
        ("chat", {**CHAT, "top_p": 0}, 400, "top_p", "greater than 0"),
        ("chat", {**CHAT, "max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1"),
        ("chat", {"model": MODEL, "messages": HELLO, "max_token": 4}, 400, "max_token", "did you mean 'max_tokens'"),
        ("chat", {**CHAT, "model": "gpt-4o"}, 404, "model", f"serves '{MODEL}'"),
        ("chat", {**CHAT, "max_tokens": 5000}, 400, "max_tokens", "max_model_len 4096"),
        ("chat", {**CHAT, "max_completion_tokens": 5000, "max_tokens": None}, 400, "max_completion_tokens",
         "lower max_completion_tokens"),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": "word " * 5000}]}, 400, "messages",
         "shorten messages"),
        ("chat", {**CHAT, "messages": []}, 400, "messages", "at least 1"),
        ("chat", {"model": MODEL, "max_tokens": 4}, 400, "messages", "Field required"),
        ("chat", {**CHAT, "messages": [{"role": "bot", "content": "x"}]}, 400, "messages.0.role", "'bot'"),
        ("chat", {**CHAT, "messages": [{"role": "user"}]}, 400, "messages.0", "needs 'content'"),
        ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         400, "messages.0.content", "text only"),
        ("chat", {**CHAT, "logprobs": True, "top_logprobs": 3}, 400, "top_logprobs", "chosen token only"),
        ("chat", {**CHAT, "tool_choice": "required"}, 400, "tool_choice", "needs tools"),
        ("chat", {**CHAT, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema",
         "needs response_format.json_schema"),
        ("chat", {**CHAT, "frequency_penalty": 0.5}, 400, "frequency_penalty", "repetition_penalty"),
        ("chat", {**CHAT, "n": 0}, 400, "n", "greater than or equal to 1"),
        ("chat", {**CHAT, "stop": [""]}, 400, "stop", "non-empty"),
        ("chat", {**CHAT, "stop_token_ids": [10**6]}, 400, "stop_token_ids", "[0, 49152)"),
        ("completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, "echo", "not supported"),
        ("completions", {"model": MODEL, "prompt": []}, 400, "prompt", "empty list"),
        ("completions", {"model": MODEL, "prompt": "x", "logprobs": 2}, 400, "logprobs", "logprobs: 0"),
        ("completions", {"model": MODEL, "prompt": "x", "stream": True}, 400, "stream", "not supported"),
    ],
)
def test_bad_requests_name_the_field(server: Server, route: str, body: dict[str, Any], status: int, param: str,
                                     says: str) -> None:
    path = {"chat": "chat/completions", "completions": "completions"}[route]
    response = httpx.post(f"{server.base_url}/{path}", json={k: v for k, v in body.items() if v is not None},
                          timeout=600)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert says in error["message"], error


@pytest.mark.parametrize(("content", "headers"), [
    (b"{not json", {"content-type": "application/json"}),
    (b"[1, 2]", {"content-type": "application/json"}),
])
def test_a_body_that_is_no_json_object_is_a_400(server: Server, content: bytes, headers: dict[str, str]) -> None:
    response = httpx.post(f"{server.base_url}/chat/completions", content=content, headers=headers, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


def test_a_client_that_disconnects_leaves_the_batch(server: Server) -> None:
    before = server.stats()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/chat/completions", timeout=httpx.Timeout(600, read=2),
                   json={**CHAT, "max_tokens": 4000, "ignore_eos": True})
    deadline = time.monotonic() + 300  # a hang guard: the server notices within its poll interval
    while True:
        now = server.stats()
        if now["generator"]["aborted"] > before["generator"]["aborted"]:
            break
        assert time.monotonic() < deadline, now
        time.sleep(0.2)
    assert now["server"]["disconnected"] == before["server"]["disconnected"] + 1
    assert now["generator"]["generated_tokens"] - before["generator"]["generated_tokens"] < 4000


# -- process behaviour ---------------------------------------------------------------------------------------


def test_api_key_and_clean_exit_on_sigterm_with_a_request_in_flight(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-local-123")
    with llm_server(tmp_path, "--api-key-env", KEY_ENV, "--shutdown-timeout", "1") as running:
        assert httpx.get(f"{running.url}/healthz").text == "OK"  # health needs no key
        denied = httpx.post(f"{running.base_url}/chat/completions", json=CHAT, timeout=600)
        assert denied.status_code == 401 and KEY_ENV in denied.json()["error"]["message"]
        with LLMClient(_endpoint(running, api_key_env=KEY_ENV, max_tokens=4)) as client:
            assert client.chat(HELLO).usage.completion_tokens > 0

        async def long_request_then_sigterm() -> BaseException | None:
            async with httpx.AsyncClient(timeout=600) as http:
                call = asyncio.ensure_future(http.post(
                    f"{running.base_url}/chat/completions", headers={"Authorization": "Bearer sk-local-123"},
                    json={**CHAT, "max_tokens": 4000, "ignore_eos": True}))
                while running.stats(Authorization="Bearer sk-local-123")["server"]["in_flight"] == 0:
                    await asyncio.sleep(0.1)
                running.process.send_signal(signal.SIGTERM)
                try:
                    await call
                except httpx.HTTPError as err:
                    return err
                return None

        asyncio.run(long_request_then_sigterm())
        assert running.process.wait(timeout=300) == 0, running.log()
        assert "Application shutdown complete" in running.log()


def test_cli_errors_exit_2_with_a_message(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentevolver.llm_server", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=600)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = run("--model", MODEL, "--port", str(taken.getsockname()[1]))
    assert busy.returncode == 2 and "already in use" in busy.stderr
    unknown = run("--model", "tiny-tset", "--port", str(free_port()))
    assert unknown.returncode == 2 and "Did you mean the built-in 'tiny-test'" in unknown.stderr
    too_long = run("--model", MODEL, "--port", str(free_port()), "--max-model-len", "100000")
    assert too_long.returncode == 2 and "max_position_embeddings (4096)" in too_long.stderr
    assert "Traceback" not in busy.stderr + unknown.stderr + too_long.stderr


# -- the real model ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_answers_a_simple_question(tmp_path: Path) -> None:
    with llm_server(tmp_path, model="smollm2-135m-instruct") as running:
        endpoint = LLMEndpointConfig(base_url=running.base_url, model="smollm2-135m-instruct", timeout_s=600,
                                     max_retries=0, max_tokens=32)
        with LLMClient(endpoint) as client:
            result = client.chat([{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in result.text
    assert result.finish_reason == "stop"
