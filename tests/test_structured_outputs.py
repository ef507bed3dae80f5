"""Structured outputs: ``response_format`` in the local server, and the roles' per-endpoint switch.

Through the real server (``python -m agentevolver.llm_server``, the random ``tiny-test`` model, so nothing but
the grammar can make a reply valid) and the official ``openai`` SDK: ``json_schema`` replies sampled at
temperature 1.0 always validate, constrained and free requests share batches, bad schemas are 400s that
name the field inside ``response_format``. ``json_object`` with the real SmolLM2 model. Then the client's
``structured_output`` switch against the scripted server (fallback after a refusal, remembered per
endpoint; explicit modes; off) and the roles (judge, task writer) through the real server.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import torch
from scripted_openai_server import Reply, ScriptedOpenAIServer
from test_llm_server import MODEL, Server, llm_server

from agentevolver.client.llm_client import LLMClient
from agentevolver.client.llm_config import LLMEndpointConfig
from agentevolver.client.structured_output import ReplySchema, is_format_refusal, reply_schema
from agentevolver.errors import LLMError
from agentevolver.llm_server.errors import ServerError
from agentevolver.llm_server.structured import StructuredOutputs, check_schema
from agentevolver.module.adv_processor.judge import JudgeInput, evaluate_step_flags
from agentevolver.module.adv_processor.judge_prompt import StepText, Transcript, parse_step_judgments
from agentevolver.module.task_manager.parsing import ask_parsed, summary_schema

pytest.importorskip("xgrammar", reason="structured outputs need the 'serve' extra (xgrammar)")

#: Every kind of constraint the roles use: enums, bounded numbers, booleans, bounded strings, fixed-length
#: arrays, nested objects, a nullable field.
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "label": {"enum": ["GOOD", "BAD"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "ok": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 12},
        "steps": {"type": "array", "items": {"enum": ["GOOD", "BAD"]}, "minItems": 3, "maxItems": 3},
        "task": {"type": "object", "properties": {"answer": {"type": ["string", "null"], "maxLength": 6}},
                 "required": ["answer"], "additionalProperties": False},
    },
    "required": ["label", "score", "ratio", "ok", "reason", "steps", "task"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}
HELLO = [{"role": "user", "content": "Judge this."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with llm_server(tmp_path_factory.mktemp("structured")) as running:
        yield running


@pytest.fixture
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
    yield client
    client.close()


def _endpoint(base_url: str, model: str = MODEL, **overrides: Any) -> LLMEndpointConfig:
    return LLMEndpointConfig(base_url=base_url, model=model, timeout_s=600, max_retries=0, backoff_initial_s=0,
                             backoff_max_s=0, **overrides)


# -- the server ------------------------------------------------------------------------------------------------


def test_json_schema_replies_always_validate_at_temperature_one(sdk: openai.OpenAI) -> None:
    """48 samples of a random model at T=1.0 (6 concurrent requests x n=8): every one is valid JSON that
    validates, and ends because its JSON was complete, not at max_tokens."""

    def ask(seed: int) -> Any:
        return sdk.chat.completions.create(model=MODEL, messages=HELLO, temperature=1.0, max_tokens=160, n=8,  # type: ignore[arg-type]
                                           seed=100 * seed, response_format=FORMAT)  # type: ignore[arg-type]

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(ask, range(6)))
    choices = [choice for reply in replies for choice in reply.choices]
    assert len(choices) == 48
    for choice in choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    assert len({choice.message.content for choice in choices}) > 24  # sampled, not one fixed reply
    assert all(choice.message.content.startswith('{"label": ') for choice in choices)  # in the schema's order


def test_constrained_and_free_requests_share_batches(server: Server, sdk: openai.OpenAI) -> None:
    before = httpx.get(f"{server.url}/stats").json()

    def ask(index: int) -> Any:
        extra = {"response_format": FORMAT, "max_tokens": 160} if index % 2 else {"max_tokens": 24}
        return sdk.chat.completions.create(model=MODEL, messages=HELLO, temperature=1.0,  # type: ignore[arg-type]
                                           seed=index, **extra)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(ask, range(8)))
    after = httpx.get(f"{server.url}/stats").json()
    assert after["generator"]["max_rows"] >= 2
    assert after["structured"]["constrained_choices"] - before["structured"]["constrained_choices"] == 4
    for index, reply in enumerate(replies):
        if index % 2:
            jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)


@pytest.mark.parametrize(("response_format", "param", "says"), [
    ({"type": "json_schema"}, "response_format.json_schema", "needs response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strng"}}},
     "response_format.json_schema.schema.type", "not a valid JSON Schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}},
     "response_format.json_schema.schema.properties.tags.uniqueItems", "not supported"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/missing"}}},
     "response_format.json_schema.schema", "cannot build a grammar"),
    ({"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {"type": "object"}}},
     "response_format.json_schema.name", "pattern"),
    ({"type": "yaml"}, "response_format.type", "json_schema"),
])
def test_a_bad_schema_is_a_400_naming_the_field(sdk: openai.OpenAI, response_format: dict[str, Any], param: str,
                                                says: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,  # type: ignore[arg-type]
                                    response_format=response_format)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert says in error["message"], error


def test_ignore_eos_cannot_be_combined_with_a_json_format(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, response_format=FORMAT,  # type: ignore[arg-type]
                                    extra_body={"ignore_eos": True})
    assert caught.value.body["param"] == "ignore_eos"  # type: ignore[index]


def test_json_object_returns_an_object_from_the_real_small_model(tmp_path: Path) -> None:
    with llm_server(tmp_path, model="smollm2-135m-instruct") as running, \
            openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=600) as client:
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=64, response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(json.loads(choice.message.content or ""), dict)


def test_check_schema_walks_subschemas_not_property_names() -> None:
    check_schema({"type": "object", "properties": {"not": {"type": "string"}, "if": {"type": "integer"}}})
    with pytest.raises(ServerError) as caught:
        check_schema({"$defs": {"item": {"anyOf": [{"type": "string"}, {"not": {"type": "null"}}]}}})
    assert caught.value.param == "response_format.json_schema.schema.$defs.item.anyOf.1.not"


# -- the client's switch ------------------------------------------------------------------------------------------

VERDICT = ReplySchema("verdict", {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
REFUSAL = Reply.error(400, "response_format type 'json_schema' is not supported")


def test_auto_falls_back_once_per_endpoint_after_a_refusal(scripted_llm: ScriptedOpenAIServer,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    scripted_llm.plan(REFUSAL, '{"ok": true}', '{"ok": false}')
    client = LLMClient(_endpoint(scripted_llm.base_url))
    first = client.chat(HELLO, schema=VERDICT)
    second = client.chat(HELLO, schema=VERDICT)
    bodies = scripted_llm.bodies
    assert bodies[0]["response_format"]["json_schema"]["schema"] == VERDICT.schema
    assert "response_format" not in bodies[1] and "response_format" not in bodies[2]  # remembered
    assert (first.text, first.structured, first.format_fallback) == ('{"ok": true}', None, True)
    assert (second.structured, second.format_fallback) == (None, False)
    assert client.format_counts == {"structured_requests": 0, "format_fallbacks": 1}
    assert client.structured_kind is None
    assert sum("does not take response_format" in r.message for r in caplog.records) == 1


def test_auto_sends_the_schema_while_the_server_takes_it(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan('{"ok": true}', '{"ok": true}', "free")
    client = LLMClient(_endpoint(scripted_llm.base_url))

    async def both() -> list[Any]:
        return [await client.achat(HELLO, schema=VERDICT), await client.achat(HELLO, schema=VERDICT)]

    replies = asyncio.run(both())
    assert [r.structured for r in replies] == ["json_schema", "json_schema"]
    assert client.chat(HELLO).structured is None  # no schema, no format
    assert "response_format" not in scripted_llm.bodies[2]
    assert client.format_counts["structured_requests"] == 2


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_an_explicit_mode_that_the_server_refuses_is_an_error_naming_the_switch(
        scripted_llm: ScriptedOpenAIServer, mode: str) -> None:
    scripted_llm.plan(REFUSAL)
    client = LLMClient(_endpoint(scripted_llm.base_url, structured_output=mode), name="local")
    with pytest.raises(LLMError, match=r"llm\.endpoints\.local\.structured_output to auto or off"):
        client.chat(HELLO, schema=VERDICT)
    assert scripted_llm.bodies[0]["response_format"]["type"] == mode


def test_off_never_sends_a_format_and_other_400s_are_not_refusals(scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan('{"ok": true}', Reply.error(400, "max_tokens is too large"))
    assert LLMClient(_endpoint(scripted_llm.base_url, structured_output="off")).chat(HELLO, schema=VERDICT).structured is None
    assert "response_format" not in scripted_llm.bodies[0]
    with pytest.raises(LLMError, match="HTTP 400"):
        LLMClient(_endpoint(scripted_llm.base_url)).chat(HELLO, schema=VERDICT)
    assert len(scripted_llm.bodies) == 2  # a 400 about something else is not retried without the format


@pytest.mark.parametrize(("status", "body", "message", "refusal"), [
    (400, {"message": "x", "param": "response_format.json_schema.schema"}, "x", True),
    (422, None, "body -> response_format: extra fields not permitted", True),
    (400, {"message": "bad", "param": "max_tokens"}, "bad", False),
    (500, {"param": "response_format"}, "response_format", False),
])
def test_what_counts_as_a_refusal(status: int, body: Any, message: str, refusal: bool) -> None:
    assert is_format_refusal(status, body, message) is refusal


def test_reply_schema_makes_every_field_required_and_keeps_field_names_like_title() -> None:
    from pydantic import BaseModel, Field

    class Note(BaseModel):
        """Docstrings are for developers, not in the wire schema."""

        title: str = Field(default="", json_schema_extra={"maxLength": 20})
        tags: list[str] = []

    schema = reply_schema(Note, tags={"maxItems": 2}).schema
    assert schema == {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                                       "tags": {"type": "array", "items": {"type": "string"},
                                                                "maxItems": 2}},
                      "required": ["title", "tags"], "additionalProperties": False}


# -- the roles through the real server ---------------------------------------------------------------------------


def test_the_judge_always_parses_with_a_random_model(server: Server) -> None:
    """The random tiny-test model cannot write 'Step N Judgment' lines; under the schema every reply parses."""
    client = LLMClient(_endpoint(server.base_url, temperature=1.0, max_tokens=64))
    rng = random.Random(0)
    inputs = []
    for sample in range(6):
        steps = tuple(StepText(f"calculator({rng.randint(1, 99)} * 3)", str(rng.randint(1, 300)))
                      for _ in range(1 + sample % 4))
        inputs.append(JudgeInput(num_steps=len(steps), outcome=1.0, grpo_advantage=0.5, success=True,
                                 transcript=Transcript(task="What is 4 * 3?", steps=steps)))
    result = asyncio.run(evaluate_step_flags(inputs, client, parse_retries=0))
    assert result.status == ["judged"] * 6, result.errors
    assert [len(flags or []) for flags in result.flags] == [1, 2, 3, 4, 1, 2]
    assert result.metrics()["adca/judge/structured_replies"] == 6.0


def test_the_task_writers_reply_has_its_shape_on_the_first_reply_with_a_random_model(server: Server) -> None:
    """The shape is guaranteed; the checks the schema cannot express (a query of at least three words) stay
    with the parser, which may still reject a structured reply."""
    client = LLMClient(_endpoint(server.base_url, temperature=1.0, max_tokens=200))
    messages = [{"role": "user", "content": "Write one task about 17 * 23 = 391 as JSON."}]
    schema = summary_schema(2, grounded=True)
    for _ in range(3):
        reply = ask_parsed(client, messages, lambda text: jsonschema.validate(json.loads(text), schema.schema),
                           retries=0, schema=schema)
        assert (reply.replies, reply.failures, reply.structured) == (1, 0, 1), reply.errors


def test_the_constraint_never_writes_a_surrogate_which_the_grammar_counts_as_one_character() -> None:
    """xgrammar 0.2.8 lets a string hold ``ED A0 80`` (U+D800 as UTF-8, not valid UTF-8) and counts it as one
    character; decoded, it is three replacement characters, so a random model's reply once came out two
    characters over its ``maxLength`` in CI. The constraint bans the second byte after the lead, and any token
    holding both."""
    import xgrammar
    from transformers import AutoTokenizer

    from agentevolver.models import resolve_model_path
    from agentevolver.schema.llm_wire import ResponseFormat

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    vocab_size = len(tokenizer)
    token_texts = tokenizer.batch_decode([[i] for i in range(vocab_size)])
    outputs = StructuredOutputs(tokenizer, vocab_size=vocab_size, stop_token_ids=[tokenizer.eos_token_id],
                                token_texts=token_texts, special_ids=frozenset(tokenizer.all_special_ids))
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 3}}, "required": ["q"]}
    response_format = ResponseFormat.model_validate({"type": "json_schema",
                                                     "json_schema": {"name": "q", "schema": schema}})
    grammar = asyncio.run(outputs.grammar_for(response_format))
    vocab = [bytes(b) for b in xgrammar.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab]
    byte_id = {data: i for i, data in enumerate(vocab) if len(data) == 1}
    lead, second, continuation = byte_id[b"\xed"], byte_id[b"\xa0"], byte_id[b"\x80"]
    opening = tokenizer.encode('{"q": "', add_special_tokens=False)

    # the premise: the grammar alone takes the surrogate as one character of three
    matcher = xgrammar.GrammarMatcher(grammar)
    assert all(matcher.accept_token(i) for i in [*opening, lead, second, continuation])

    constraint = outputs.constraint(grammar)
    for token in opening:
        constraint.accept(token)
    scores = torch.zeros(vocab_size)
    constraint.mask(scores)
    assert torch.isfinite(scores[lead]) and not torch.isfinite(scores[second])  # a lone A0 is not UTF-8 anyway
    joined = [i for i, data in enumerate(vocab) if b"\xed\xa0" in data or b"\xed\xbf" in data]
    assert all(not torch.isfinite(scores[i]) for i in joined)
    constraint.accept(lead)
    scores = torch.zeros(vocab_size)
    constraint.mask(scores)
    assert not torch.isfinite(scores[second]), "a second byte A0..BF after ED would write a surrogate"
    assert torch.isfinite(scores[continuation]), "ED 80..9F starts a valid character (U+D000-U+D7FF)"
    constraint.accept(continuation)
    scores = torch.zeros(vocab_size)
    constraint.mask(scores)
    assert torch.isfinite(scores[continuation]), "the pending lead is gone once a byte follows it"


def test_judge_json_replies_parse_and_a_wrong_count_is_an_error() -> None:
    assert parse_step_judgments('{"judgments": ["GOOD", "BAD"]}', 2) == [True, False]
    with pytest.raises(ValueError, match="expected 3 judgments"):
        parse_step_judgments('{"judgments": ["GOOD", "BAD"]}', 3)


def test_a_callers_own_response_format_is_sent_as_is_and_a_refusal_is_an_ordinary_error(
        scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.plan(REFUSAL)
    client = LLMClient(_endpoint(scripted_llm.base_url))
    with pytest.raises(LLMError, match="HTTP 400"):
        client.chat(HELLO, schema=VERDICT, response_format={"type": "json_object"})
    assert scripted_llm.bodies[0]["response_format"] == {"type": "json_object"}
    assert client.structured_kind == "json_schema"  # the caller's format says nothing about the endpoint
