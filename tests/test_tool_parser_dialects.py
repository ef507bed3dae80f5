"""Model-dialect tool-call parsers, selectable by verl's names (``agent_flow.tools.tool_parser: gpt-oss``, ...).

Each dialect is tested on an assistant turn written as that model's chat template renders one (prose, then
the call block(s), as the generated text reaches the parser: decoded with special tokens kept), and the
same text is given to verl 0.9.1's own parser of that name, which must find the same calls. Then the cases
where ours is stricter or reads more than verl's: malformed blocks become error lines the model is shown,
schema-typed values, nested values, several calls per block.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agentevolver.config import load_config
from agentevolver.module.tools.config import ToolsConfig, make_parser
from agentevolver.module.tools.parsing import ParsedAction, build_parser, get_parser, parser_names

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather forecast.",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time.",
        "parameters": {"type": "object", "required": ["tz"], "properties": {"tz": {"type": "string"}}}}},
]

DSML = "｜DSML｜"

#: name -> (rendered assistant turn, expected calls, expected content)
RENDERED: dict[str, tuple[str, list[tuple[str, dict[str, Any]]], str]] = {
    "hermes": (
        'Checking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    "qwen3_coder": (
        "Checking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
        "<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    # The prompt ends with <|start|>assistant: the completion starts at the first message's channel.
    "gpt-oss": (
        "<|channel|>analysis<|message|>User wants the weather in Paris.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city": "Paris", "days": 3}<|call|>',
        [("get_weather", {"city": "Paris", "days": 3})],
        "",
    ),
    "glm": (
        "<think>I need the weather and the time.</think>\nChecking both.\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
        "</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n<arg_value>CET</arg_value>\n</tool_call>"
        "<|observation|>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "<think>I need the weather and the time.</think>\nChecking both.",
    ),
    "seed": (
        "Checking both.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
        "<parameter=days>3</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=get_time>\n"
        "<parameter=tz>CET</parameter>\n</function>\n</seed:tool_call>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    "minimax": (
        'Checking both.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">CET'
        "</parameter>\n</invoke>\n</minimax:tool_call>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    "kimi": (
        "Checking both.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "days": 3}<|tool_call_end|><|tool_call_begin|>'
        'functions.get_time:1<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    "deepseek_v4": (
        f'Checking both.\n\n<{DSML}tool_calls>\n<{DSML}invoke name="get_weather">\n'
        f'<{DSML}parameter name="city" string="true">Paris</{DSML}parameter>\n'
        f'<{DSML}parameter name="days" string="false">3</{DSML}parameter>\n</{DSML}invoke>\n'
        f'<{DSML}invoke name="get_time">\n<{DSML}parameter name="tz" string="true">CET</{DSML}parameter>\n'
        f"</{DSML}invoke>\n</{DSML}tool_calls><｜end▁of▁sentence｜>",
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
    "gemma4": (
        'Checking both.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
        '<|tool_call>call:get_time{tz:<|"|>CET<|"|>}<tool_call|>',
        [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"tz": "CET"})],
        "Checking both.",
    ),
}

DIALECTS = ["gpt-oss", "glm", "seed", "minimax", "kimi", "deepseek_v4", "gemma4"]


def _calls(action: ParsedAction) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, call.function.arguments_dict()) for call in action.tool_calls]


class _TextTokenizer:
    """What verl's parsers need of a tokenizer, holding the text itself: ``decode`` returns it."""

    pad_token = "<|pad|>"
    unk_token_id = None

    def __init__(self, text: str, vocab: dict[str, int] | None = None) -> None:
        self.text, self.vocab = text, vocab or {}

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return self.text

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.vocab.get(token)


def _verl_calls(name: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    parser = ToolParser.get_tool_parser(name, _TextTokenizer(text, {"<tool_call|>": 9}))
    tools = [OpenAIFunctionToolSchema.model_validate(tool) for tool in TOOLS]
    _, calls = asyncio.run(parser.extract_tool_calls([0], tools))
    return [(call.name, json.loads(call.arguments)) for call in calls]


# ------------------------------------------------------------------------------------------ selection


def test_every_verl_parser_name_is_selectable() -> None:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    assert set(ToolParser._registry) <= set(parser_names())
    assert set(RENDERED) == set(ToolParser._registry)  # this file covers each of them


@pytest.mark.parametrize("name", DIALECTS)
def test_dialect_is_a_valid_tools_config_value(name: str) -> None:
    parser = make_parser(ToolsConfig.model_validate({"tool_parser": name}))
    assert parser.name == name
    composite = make_parser(ToolsConfig.model_validate({"tool_parser": [name, "final_answer"]}))
    assert composite.stop_tokens == get_parser(name).stop_tokens


def test_dialect_selected_in_the_run_config() -> None:
    _, settings = load_config(["agent_flow.tools.tool_parser=gpt-oss"])
    parser = make_parser(settings.agent_flow.tools)
    assert type(parser).__name__ == "GptOssParser"
    assert _calls(parser.parse(RENDERED["gpt-oss"][0], tools=TOOLS)) == RENDERED["gpt-oss"][1]


# ------------------------------------------------------------------------------------------ rendered turns


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_rendered_turn(name: str) -> None:
    text, expected, content = RENDERED[name]
    action = get_parser(name).parse(text, step=2, tools=TOOLS)
    assert action.errors == []
    assert _calls(action) == expected
    assert action.content == content
    ids = [call.id for call in action.tool_calls]
    assert len(set(ids)) == len(ids) and all(ids)


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_same_calls_as_verls_parser(name: str) -> None:
    text, expected, _ = RENDERED[name]
    assert _verl_calls(name, text) == expected


def test_kimi_keeps_the_models_call_ids() -> None:
    action = get_parser("kimi").parse(RENDERED["kimi"][0], step=0)
    assert [call.id for call in action.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]


def test_gpt_oss_final_channel_is_the_content_and_analysis_is_dropped() -> None:
    text = ("<|channel|>analysis<|message|>Sunny per the tool.<|end|><|start|>assistant<|channel|>final"
            "<|message|>It is sunny in Paris.<|return|>")
    action = get_parser("gpt-oss").parse(text)
    assert action.tool_calls == [] and action.errors == []
    assert action.content == "It is sunny in Paris."


def test_gpt_oss_call_in_the_first_message_and_recipient_before_the_channel() -> None:
    first = '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": "CET"}<|call|>'
    header_first = ('<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{"tz": "UTC"}'
                    "<|call|>")
    assert _calls(get_parser("gpt-oss").parse(first)) == [("get_time", {"tz": "CET"})]
    assert _calls(get_parser("gpt-oss").parse(header_first)) == [("get_time", {"tz": "UTC"})]
    # a stop token the decoder dropped: the call still reads
    assert _calls(get_parser("gpt-oss").parse(first.removesuffix("<|call|>"))) == [("get_time", {"tz": "CET"})]


def test_plain_text_is_content_for_every_dialect() -> None:
    for name in DIALECTS:
        action = get_parser(name).parse("  The answer is 42.  ")
        assert (action.content, action.tool_calls, action.errors) == ("The answer is 42.", [], []), name


# ------------------------------------------------------------------------------------------ malformed


MALFORMED = {
    "gpt-oss": '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"tz": CET}<|call|>',
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>",
    "seed": "<seed:tool_call>\n<parameter=city>Paris</parameter>\n</seed:tool_call>",
    "minimax": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>',
    "kimi": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
            "{tz: CET}<|tool_call_end|><|tool_calls_section_end|>",
    "deepseek_v4": f'<{DSML}tool_calls>\n<{DSML}invoke name="get_weather">\n<{DSML}parameter name="days" '
                   f'string="false">three</{DSML}parameter>\n</{DSML}invoke>\n</{DSML}tool_calls>',
    "gemma4": '<|tool_call>call:get_weather{city:<|"|>Paris}<tool_call|>',
}


@pytest.mark.parametrize("name", DIALECTS)
def test_malformed_block_is_reported_not_dropped(name: str) -> None:
    action = get_parser(name).parse(MALFORMED[name], tools=TOOLS)
    assert action.tool_calls == []
    assert len(action.errors) == 1 and action.has_action
    assert "write " in action.errors[0] or "unterminated" in action.errors[0] or "twice" in action.errors[0]


def test_a_broken_call_does_not_hide_a_good_one() -> None:
    text = RENDERED["glm"][0] + "\n" + MALFORMED["glm"]
    action = get_parser("glm").parse(text, tools=TOOLS)
    assert [name for name, _ in _calls(action)] == ["get_weather", "get_time"]
    assert len(action.errors) == 1 and "block 3" in action.errors[0]


# ------------------------------------------------------------------------------------------ values


@pytest.mark.parametrize("name", ["glm", "seed", "minimax"])
def test_string_parameters_stay_strings_by_schema(name: str) -> None:
    body = {
        "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
               "<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>days</arg_key>\n"
               "<arg_value>2</arg_value>\n</tool_call>",
        "seed": "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                "<parameter=zip>75001</parameter>\n<parameter=days>2</parameter>\n</function>\n</seed:tool_call>",
        "minimax": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                   '<parameter name="zip">75001</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n'
                   "</minimax:tool_call>",
    }[name]
    typed = get_parser(name).parse(body, tools=TOOLS)
    assert _calls(typed) == [("get_weather", {"city": "Paris", "zip": "75001", "days": 2})]
    # without the schema a value that reads as JSON is JSON (vLLM's and verl's reading)
    assert _calls(get_parser(name).parse(body))[0][1]["zip"] == 75001


def test_gemma4_nested_values() -> None:
    text = ('<|tool_call>call:plan{stops:[<|"|>Paris<|"|>, <|"|>Lyon, France<|"|>],opts:{fast:true,max:2.5,'
            'note:null},label:draft}<tool_call|>')
    assert _calls(get_parser("gemma4").parse(text)) == [
        ("plan", {"stops": ["Paris", "Lyon, France"], "opts": {"fast": True, "max": 2.5, "note": None},
                  "label": "draft"})]


def test_seed_block_with_two_functions() -> None:
    text = ("<seed:tool_call>\n<function=get_time>\n<parameter=tz>CET</parameter>\n</function>\n"
            "<function=get_time>\n<parameter=tz>UTC</parameter>\n</function>\n</seed:tool_call>")
    assert _calls(get_parser("seed").parse(text, tools=TOOLS)) == [("get_time", {"tz": "CET"}),
                                                                   ("get_time", {"tz": "UTC"})]


# ------------------------------------------------------------------------------------------ stop tokens


def test_stop_token_ids() -> None:
    tokenizer = _TextTokenizer("", {"<tool_call|>": 11, "<|observation|>": 12, "<|call|>": 13})
    assert get_parser("gemma4").stop_token_ids(tokenizer) == [11]
    assert get_parser("glm").stop_token_ids(tokenizer) == [12]
    assert get_parser("gpt-oss").stop_token_ids(tokenizer) == [13]
    assert get_parser("hermes").stop_token_ids(tokenizer) == []
    assert get_parser("kimi").stop_token_ids(tokenizer) == []  # a tokenizer without the token: nothing
    assert build_parser(["gemma4", "glm"]).stop_token_ids(tokenizer) == [11, 12]
