"""The local LLM server fuzzed against its own OpenAPI schema (schemathesis, in process, tiny-test).

The app is built in process around a real :class:`Engine` serving ``tiny-test`` (the test model of
tests/test_llm_server.py) with an API key required, and driven through schemathesis's ASGI transport: per
operation ``EXAMPLES`` requests that fit the schema and ``EXAMPLES`` that break it (5 operations: at most
5 x 2 x 10 = 100 requests, about 30 s on the 2-core machine). Generation is kept short: every
schema-fitting request is capped at ``max_tokens`` 4 and ``n`` 2, and the engine's ``max_model_len`` of
256 bounds whatever else gets through. Required of every answer: no 5xx; status, content type and body as
``/openapi.json`` declares them (OpenAI's ``ChatCompletion`` / ``Completion`` models); every error
OpenAI's ``{"error": {message, type, param, code}}`` with ``param`` naming the field.

Half of the schema-fitting requests name the served model (``MODEL``), so they reach the generator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import strategies as st
from schema_fuzz import asgi_schema, fuzz_schema, json_error_names_field, stop_apps

#: Generated requests per operation and mode (positive, negative) in the default suite.
EXAMPLES = 10
MODEL = "tiny-test"
KEY_ENV = "AGENTEVOLVER_FUZZ_LLM_KEY"
KEY = "fuzz-key"
MAX_TOKENS = 4


@pytest.fixture
def app() -> Iterator[Any]:
    import torch

    from agentevolver.llm_server.app import create_app
    from agentevolver.llm_server.engine import Engine
    from agentevolver.models import resolve_model_path

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's default (--threads 1): far faster on a shared machine
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, KEY)
        engine = Engine.load(str(resolve_model_path(MODEL)), served_name=MODEL, max_model_len=256, seed=0)
        yield create_app(engine, api_key_env=KEY_ENV)
        stop_apps()
    torch.set_num_threads(threads)


def _pin(case: Any, data: st.DataObject) -> None:
    """Keep generation short in every schema-fitting request; name the served model in half of them."""
    if not isinstance(case.body, dict):
        return
    body = case.body
    for field in ("max_tokens", "max_completion_tokens"):
        if body.get(field) is not None:
            body[field] = min(int(body[field]), MAX_TOKENS)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    if body.get("n") is not None:
        body["n"] = min(int(body["n"]), 2)
        if body.get("best_of") is not None:
            body["best_of"] = body["n"]
    if not data.draw(st.booleans(), label="pin"):
        return
    body["model"] = MODEL
    # rules a JSON schema cannot state (each a 400 naming its field, covered by the unpinned half)
    if isinstance(body.get("messages"), list):
        body["messages"] = body["messages"][:4]  # prompts within max_model_len
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if content is None and not (message.get("role") == "assistant" and message.get("tool_calls")):
            message["content"] = "say hello"
        elif isinstance(content, str):
            message["content"] = content[:80]
        elif isinstance(content, list):
            message["content"] = [{**part, "text": str(part.get("text", ""))[:80]} if isinstance(part, dict) else part
                                  for part in content[:2]]
    for field in _NEUTRAL_ONLY:
        body.pop(field, None)


#: Fields accepted only at their neutral value (agentevolver/schema/llm_wire.py), and tool_choice (a forced one
#: decodes under the tools' schemas, which random tools rarely make compilable: tests/test_forced_tool_choice.py):
#: dropped from the pinned requests.
_NEUTRAL_ONLY = ("frequency_penalty", "presence_penalty", "logit_bias", "top_logprobs", "tool_choice", "echo",
                 "suffix", "best_of")


def test_llm_server_answers_every_generated_request_as_its_schema_declares(app: Any) -> None:
    # 400 for schema-fitting requests: OpenAI fields this server accepts only at their neutral value
    # (penalties, logit_bias, top_logprobs), prompts longer than max_model_len; each names its field.
    counts = fuzz_schema(asgi_schema(app, domain_rejections=(400,)), max_examples=EXAMPLES,
                         headers={"Authorization": f"Bearer {KEY}"}, pin=_pin,
                         checks=[json_error_names_field(field_key="param")])
    assert len(counts) == 5 and all(count >= 1 for count in counts.values()), counts
