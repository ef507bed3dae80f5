"""``tool_choice: "required"`` and a named function in the local server: the reply is a tool call.

Through the real server (``python -m agentevolver.llm_server``) and the official ``openai`` SDK. With the random
``tiny-test`` model nothing but the grammar can make a reply a valid call: sampled at temperature 1.0, every
choice comes back as ``message.tool_calls`` whose arguments validate against the called tool's parameters.
Then the refusals (each a 400 naming the field), a reply cut by the token limit, and the real SmolLM2 model
given calc's tools, which called them with argument names the tools do not take when only asked (issue 43).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from test_llm_server import MODEL, Server, llm_server

from agentevolver.llm_server.forced_calls import read_calls
from agentevolver.schema.llm_wire import NamedToolChoice

pytest.importorskip("xgrammar", reason="a forced tool_choice needs the 'serve' extra (xgrammar)")

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 24}},
                   "required": ["expression"]}}}
CONVERT = {"type": "function", "function": {
    "name": "convert_units", "description": "Convert a quantity between units.",
    "parameters": {"type": "object", "properties": {
        "value": {"type": "number"}, "from_unit": {"enum": ["km", "m", "mi"]}, "to_unit": {"enum": ["km", "m", "mi"]}},
        "required": ["value", "from_unit", "to_unit"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The current time."}}  # no parameters
TOOLS = [CALCULATOR, CONVERT, NOW]
PARAMETERS = {tool["function"]["name"]: tool["function"].get("parameters", {"type": "object"}) for tool in TOOLS}
ASK = [{"role": "user", "content": "How many meters are in 3 km? Use a tool."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with llm_server(tmp_path_factory.mktemp("forced_calls")) as running:
        yield running


@pytest.fixture
def sdk(server: Server) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)
    yield client
    client.close()


def _calls(choice: Any) -> list[tuple[str, dict[str, Any]]]:
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    calls = [(call.function.name, json.loads(call.function.arguments)) for call in choice.message.tool_calls]
    for name, arguments in calls:
        jsonschema.validate(arguments, PARAMETERS[name])
    assert len({call.id for call in choice.message.tool_calls}) == len(calls)
    return calls


def test_required_makes_every_sampled_reply_a_valid_call(sdk: openai.OpenAI) -> None:
    """12 samples of a random model at T=1.0 with parallel_tool_calls false: each reply is exactly one call of
    a given tool, with arguments that validate. With parallel calls allowed a reply may hold several (a random
    model sometimes writes calls until the token limit: that reply is cut, see the test below)."""
    single = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                         parallel_tool_calls=False, temperature=1.0, max_tokens=200, n=12, seed=7)
    calls = [_calls(choice) for choice in single.choices]
    assert all(len(choice) == 1 for choice in calls)
    assert len({json.dumps(choice) for choice in calls}) > 6  # sampled, not one fixed reply
    several = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                          temperature=1.0, max_tokens=200, n=12, seed=7)
    complete = [_calls(choice) for choice in several.choices if choice.finish_reason != "length"]
    assert len(complete) >= 6 and max(len(choice) for choice in complete) >= 2


def test_a_named_function_is_the_one_called(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=1.0, max_tokens=120, n=8, seed=3,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "convert_units"}})
    for choice in reply.choices:
        [(name, arguments)] = _calls(choice)
        assert name == "convert_units" and set(arguments) == {"value", "from_unit", "to_unit"}
    empty = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=20,  # type: ignore[arg-type]
                                        tool_choice={"type": "function", "function": {"name": "now"}})
    assert _calls(empty.choices[0]) == [("now", {})]


def test_a_reply_cut_by_the_token_limit_comes_back_as_text(sdk: openai.OpenAI) -> None:
    reply = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                        max_tokens=3)
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    assert (choice.message.content or "").startswith("[{")


@pytest.mark.parametrize(("extra", "param", "says"), [
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "weather"}}},
     "tool_choice.function.name", "not among the tools"),
    ({"tools": [{"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}}}}], "tool_choice": "required"},
     "tools[0].function.parameters.properties.tags.uniqueItems", "not supported"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "leave response_format out"),
])
def test_what_cannot_be_forced_is_a_400_naming_the_field(sdk: openai.OpenAI, extra: dict[str, Any], param: str,
                                                         says: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, **extra)  # type: ignore[arg-type]
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert says in error["message"], error


def test_the_real_small_model_calls_calc_tools_with_their_own_argument_names(tmp_path: Path) -> None:
    """SmolLM2-135M, greedy, asked a calc question with the calculator and the converter: with 'required' the
    reply is a call with exactly the arguments the tool takes (issue 43 saw it pass 'value' and made-up names to
    the calculator when only asked)."""
    with llm_server(tmp_path, model="smollm2-135m-instruct") as running, \
            openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=600) as client:
        for question in ("What is 17 * 23?", "How many meters are in 3 km?"):
            reply = client.chat.completions.create(
                model="smollm2-135m-instruct", temperature=0, max_tokens=60, tool_choice="required",
                parallel_tool_calls=False, tools=[CALCULATOR, CONVERT],  # type: ignore[list-item]
                messages=[{"role": "user", "content": question}])
            [(name, arguments)] = _calls(reply.choices[0])
            assert set(arguments) == set(PARAMETERS[name]["required"])


def test_calls_are_read_back_with_the_arguments_as_written() -> None:
    named = NamedToolChoice(function={"name": "convert_units"})
    assert read_calls('[{"name": "a", "arguments": {"v": 4E400}}, {"name": "now", "arguments": {}}]', "required") == [
        ("a", '{"v": 4E400}'), ("now", "{}")]  # not re-encoded: json would write Infinity, which is not JSON
    assert read_calls('[{"name":"a","arguments":{"x":1}}]', "required") == [("a", '{"x": 1}')]  # other spacing
    assert read_calls('{"value": 3, "from_unit": "km"}', named) == [("convert_units", '{"value": 3, "from_unit": "km"}')]
    for cut in ('[{"name": "a", "arguments": {"v": 1}}, {"name": ', "[", "[]", '{"value": 3', ""):
        assert read_calls(cut, "required") is None
    assert read_calls('{"value": 3', named) is None and read_calls("[1]", "required") is None
