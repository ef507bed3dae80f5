"""Tool-call parsers: registry, each built-in format (well-formed, malformed, mixed), ids, token-id input.

The hermes round trip renders random calls with the project's real chat template (through transformers'
renderer, as ``apply_chat_template`` does) and parses the assistant turn back.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentevolver.errors import ConfigError, DuplicateNameError, UnknownNameError
from agentevolver.models.template import chat_template
from agentevolver.module.tools.parsing import (
    CompositeParser,
    ParsedAction,
    ToolCallParser,
    assign_call_ids,
    build_parser,
    get_parser,
    parser_names,
    register_parser,
)
from agentevolver.schema.message import ChatMessage, ToolCall, ToolFunction


def _call(name: str, arguments: dict[str, Any], call_id: str = "") -> ToolCall:
    return ToolCall(id=call_id, function=ToolFunction(name=name, arguments=arguments))


def _calls(action: ParsedAction) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, call.function.arguments_dict()) for call in action.tool_calls]


# ------------------------------------------------------------------------------------------ registry


def test_builtin_parsers_are_registered() -> None:
    assert {"hermes", "qwen3_coder", "python_code", "final_answer", "composite"} <= set(parser_names())


def test_unknown_parser_name_lists_the_registered_ones() -> None:
    with pytest.raises(UnknownNameError) as err:
        get_parser("llama3_json")
    message = str(err.value)
    assert message.startswith("tool_parser: unknown tool parser 'llama3_json'; registered: composite, ")
    for name in ("hermes", "qwen3_coder", "python_code", "final_answer"):
        assert name in message


def test_second_parser_under_a_taken_name_is_an_error() -> None:
    class Other(ToolCallParser):
        def extract(self, text: str, tools: Any = None) -> ParsedAction:
            return ParsedAction(content=text)

    with pytest.raises(DuplicateNameError, match=r"tool parser 'hermes' is already registered by .*HermesParser"):
        register_parser("hermes")(Other)
    assert type(get_parser("hermes")).__name__ == "HermesParser"


def test_a_plugin_parser_is_selectable_by_name() -> None:
    @register_parser("test_upper_echo")
    class UpperEcho(ToolCallParser):
        def extract(self, text: str, tools: Any = None) -> ParsedAction:
            return ParsedAction(content=text.upper())

    assert build_parser("test_upper_echo").parse("hi").content == "HI"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "empty list"),
        ({"tool_name": "x"}, "'name'"),
        ({"name": "python_code", "bogus": 1}, "bad options"),
        (["hermes", "nope"], "unknown tool parser 'nope'"),
        (3, "tool_parser must be"),
    ],
)
def test_bad_parser_specs_are_config_errors(spec: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_parser(spec)


def test_build_parser_forms() -> None:
    assert type(build_parser("hermes")).__name__ == "HermesParser"
    custom = build_parser({"name": "python_code", "tool_name": "exec_code"})
    assert custom.parse("```python\nx = 1\n```").tool_calls[0].function.name == "exec_code"
    composite = build_parser(["hermes", {"name": "final_answer"}])
    assert isinstance(composite, CompositeParser)
    assert build_parser(composite) is composite


# -------------------------------------------------------------------------------------------- hermes

HERMES = get_parser("hermes")


def test_hermes_single_call_with_prose_around_it() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "18*7"}}\n</tool_call>\nDone?'
    action = HERMES.parse(text)
    assert _calls(action) == [("calc", {"expression": "18*7"})]
    assert action.content == "Let me compute.\nDone?"
    assert action.errors == []
    assert action.final_answer is None


def test_hermes_multiple_calls_tolerate_whitespace_and_newlines() -> None:
    text = (
        '<tool_call>{"name":"a","arguments":{}}</tool_call>'
        '  \n\n<tool_call>\n\n   {"name": "b",\n "arguments": {"x": [1, 2]}}   \n\n</tool_call>\n'
    )
    action = HERMES.parse(text, step=4)
    assert _calls(action) == [("a", {}), ("b", {"x": [1, 2]})]
    assert [call.id for call in action.tool_calls] == ["call_4_0", "call_4_1"]
    assert action.content == ""


def test_hermes_text_without_calls_is_content_only() -> None:
    action = HERMES.parse("  The answer is 4.  ")
    assert action == ParsedAction(content="The answer is 4.")
    assert not action.has_action


@pytest.mark.parametrize(
    ("block", "fragment"),
    [
        ('{"name": "calc", "arguments": {"x": 1}', "invalid JSON"),
        ("not json at all", "invalid JSON"),
        ('{"arguments": {"x": 1}}', "missing tool 'name'"),
        ('{"name": "", "arguments": {}}', "missing tool 'name'"),
        ('{"name": 7, "arguments": {}}', "missing tool 'name'"),
        ('{"name": "calc", "arguments": [1, 2]}', "must be a JSON object, got list"),
        ('{"name": "calc", "arguments": "1 + 2"}', "string that is not a JSON object"),
        ('["calc", {}]', "expected a JSON object, got list"),
        ('{"name": "calc", "arguments": {}} trailing', "invalid JSON"),
    ],
)
def test_hermes_malformed_block_is_reported_not_raised(block: str, fragment: str) -> None:
    text = f'ok <tool_call>{block}</tool_call> <tool_call>{{"name": "good", "arguments": {{}}}}</tool_call>'
    action = HERMES.parse(text)
    assert _calls(action) == [("good", {})]
    assert len(action.errors) == 1
    assert action.errors[0].startswith("<tool_call> block 1: ")
    assert fragment in action.errors[0]
    assert action.content == "ok"
    assert action.tool_calls[0].id == "call_0_0"


def test_hermes_unterminated_last_block_is_an_error() -> None:
    text = 'first <tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "arguments": {}}'
    action = HERMES.parse(text)
    assert _calls(action) == [("a", {})]
    assert action.errors == ["<tool_call> block 2: unterminated (no </tool_call>); the call was not run"]
    assert action.content == "first\nthen"


def test_hermes_unterminated_block_followed_by_a_good_one() -> None:
    text = '<tool_call>{"name": "a", <tool_call>{"name": "b", "arguments": {"k": 1}}</tool_call>'
    action = HERMES.parse(text)
    assert _calls(action) == [("b", {"k": 1})]
    assert len(action.errors) == 1 and "block 1: unterminated" in action.errors[0]


def test_hermes_close_tag_inside_a_string_argument_does_not_cut_the_call() -> None:
    args = {"html": "<b></tool_call></b>", "note": "<tool_call>"}
    text = f"<tool_call>{json.dumps({'name': 'render', 'arguments': args})}</tool_call>"
    action = HERMES.parse(text)
    assert _calls(action) == [("render", args)]
    assert action.errors == []


def test_hermes_tolerated_variants() -> None:
    text = (
        '<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
        '<tool_call>{"name": "d", "arguments": null, "id": "model_id_7"}</tool_call>'
    )
    action = HERMES.parse(text, step=1)
    assert _calls(action) == [("a", {"x": 1}), ("b", {"y": 2}), ("c", {}), ("d", {})]
    assert [call.id for call in action.tool_calls] == ["call_1_0", "call_1_1", "call_1_2", "model_id_7"]


def test_call_ids_are_positional_and_repeated_model_ids_are_replaced() -> None:
    calls = [_call("a", {}, "same"), _call("b", {}, "same"), _call("c", {})]
    assert [call.id for call in assign_call_ids(calls, step=2)] == ["same", "call_2_1", "call_2_2"]
    # Deterministic: parsing the same text twice gives identical calls (no uuid).
    text = '<tool_call>{"name": "a", "arguments": {"q": 1}}</tool_call>'
    assert HERMES.parse(text, step=3) == HERMES.parse(text, step=3)


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**12), max_value=10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_CALLS = st.lists(
    st.builds(
        _call,
        name=st.text(min_size=1, max_size=16).filter(lambda name: name.strip() != ""),
        arguments=st.dictionaries(st.text(max_size=8), _JSON, max_size=4),
    ),
    max_size=4,
)


def _render_assistant(content: str, calls: list[ToolCall]) -> str:
    """The assistant turn exactly as the built-in chat template renders it."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [
        ChatMessage(role="user", content="go"),
        ChatMessage(role="assistant", content=content, tool_calls=calls or None),
    ]
    rendered, _ = render_jinja_template(
        conversations=[[message.model_dump(exclude_none=True) for message in messages]],
        chat_template=chat_template(),
    )
    header = "<|im_start|>assistant\n"
    turn = rendered[0][rendered[0].rindex(header) + len(header) :]
    assert turn.endswith("<|im_end|>\n")
    return turn[: -len("<|im_end|>\n")]


def test_template_rendering_matches_the_hermes_layout() -> None:
    turn = _render_assistant("Checking.", [_call("calc", {"expression": "1+1"})])
    assert (
        turn == 'Checking.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>'
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    content=st.text(max_size=30).filter(lambda text: "<tool_call>" not in text),
    calls=_CALLS,
    step=st.integers(min_value=0, max_value=50),
)
def test_hermes_round_trip_through_the_chat_template(content: str, calls: list[ToolCall], step: int) -> None:
    action = HERMES.parse(_render_assistant(content, calls), step=step)
    expected = [call.model_copy(update={"id": f"call_{step}_{i}"}) for i, call in enumerate(calls)]
    assert action.tool_calls == expected
    assert action.errors == []
    assert action.content == content.strip()


# --------------------------------------------------------------------------------------- qwen3_coder

QWEN = get_parser("qwen3_coder")

QWEN_TEXT = """I will look it up.
<tool_call>
<function=get_weather>
<parameter=city>
Paris
</parameter>
<parameter=days>
3
</parameter>
<parameter=options>
{"units": "metric", "hourly": false}
</parameter>
</function>
</tool_call>
<tool_call>
<function=convert>
<parameter=value>
12.5
</parameter>
<parameter=label>
line one
line two
</parameter>
</function>
</tool_call>"""


def test_qwen3_coder_calls_with_typed_values() -> None:
    action = QWEN.parse(QWEN_TEXT, step=2)
    assert _calls(action) == [
        ("get_weather", {"city": "Paris", "days": 3, "options": {"units": "metric", "hourly": False}}),
        ("convert", {"value": 12.5, "label": "line one\nline two"}),
    ]
    assert [call.id for call in action.tool_calls] == ["call_2_0", "call_2_1"]
    assert action.content == "I will look it up."
    assert action.errors == []


def test_qwen3_coder_keeps_strings_where_the_schema_says_string() -> None:
    text = "<tool_call><function=lookup><parameter=zip>\n02139\n</parameter><parameter=n>\n5\n</parameter></function></tool_call>"
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {
                    "type": "object",
                    "properties": {"zip": {"type": "string"}, "n": {"type": "integer"}},
                },
            },
        }
    ]
    assert _calls(QWEN.parse(text, tools=tools)) == [("lookup", {"zip": "02139", "n": 5})]
    # Without the schema the value is read as JSON when it parses; "02139" does not (leading zero).
    assert _calls(QWEN.parse(text.replace("02139", "123"))) == [("lookup", {"zip": 123, "n": 5})]


def test_qwen3_coder_tolerates_missing_close_tags_inside_the_block() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</tool_call>"
    assert _calls(QWEN.parse(text)) == [("f", {"a": 1, "b": "x"})]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "no <function=NAME> inside"),
        ("<tool_call><function=>\n</function></tool_call>", "empty function name"),
        (
            "<tool_call><function=f><parameter=a>1</parameter><parameter=a>2</parameter></function></tool_call>",
            "gives parameter 'a' twice",
        ),
        ("<tool_call><function=f><parameter=>1</parameter></function></tool_call>", "without a name"),
        ("<tool_call><function=f><parameter=a>1</parameter></function>", "unterminated"),
    ],
)
def test_qwen3_coder_malformed_blocks_are_reported(text: str, fragment: str) -> None:
    good = "<tool_call><function=ok></function></tool_call>"
    action = QWEN.parse(good + "\n" + text)
    assert _calls(action) == [("ok", {})]
    assert len(action.errors) == 1 and fragment in action.errors[0]


# ---------------------------------------------------------------------------------------- python_code

PYTHON = get_parser("python_code")


def test_python_code_blocks_become_run_python_calls() -> None:
    text = "First:\n```python\nx = 1\nprint(x)\n```\nthen\n```py\nprint(2)\n```\nend"
    action = PYTHON.parse(text, step=5)
    assert _calls(action) == [
        ("run_python", {"code": "x = 1\nprint(x)"}),
        ("run_python", {"code": "print(2)"}),
    ]
    assert [call.id for call in action.tool_calls] == ["call_5_0", "call_5_1"]
    assert action.content == "First:\nthen\nend"


def test_python_code_ignores_other_languages_and_plain_text() -> None:
    text = "Run this:\n```bash\nls\n```\nand `inline` code, no python block."
    action = PYTHON.parse(text)
    assert action.tool_calls == [] and action.errors == []
    assert action.content == text


def test_python_code_tool_and_argument_names_are_configurable() -> None:
    parser = get_parser("python_code", tool_name="execute", argument="source", languages=["python"])
    action = parser.parse("```python\n1 + 1\n```")
    assert _calls(action) == [("execute", {"source": "1 + 1"})]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("```python\nprint(1)\n", "unterminated"),
        ("```python\n   \n```", "empty code block"),
    ],
)
def test_python_code_malformed_blocks_are_reported(text: str, fragment: str) -> None:
    action = PYTHON.parse("```python\nok()\n```\n" + text)
    assert _calls(action) == [("run_python", {"code": "ok()"})]
    assert len(action.errors) == 1 and fragment in action.errors[0]


# --------------------------------------------------------------------------------------- final_answer

FINAL = get_parser("final_answer")


@pytest.mark.parametrize(
    ("text", "content", "answer"),
    [
        ("I computed it.\nFINAL ANSWER: 42", "I computed it.", "42"),
        ("final answer:   Paris, France  \n", "", "Paris, France"),
        ("Thinking...\n**Final Answer:** 3.14", "Thinking...", "3.14"),
        ("FINAL ANSWER: 42\nbecause 6 * 7 = 42", "", "42\nbecause 6 * 7 = 42"),
        (
            "I'll give the FINAL ANSWER: later.\nWork.\nFinal Answer: 7",
            "I'll give the FINAL ANSWER: later.\nWork.",
            "7",
        ),
        ("FINAL ANSWER:\n```python\ndef f():\n    return 1\n```", "", "def f():\n    return 1"),
        ("FINAL ANSWER: see\n```\ntable\n```", "", "see\n```\ntable\n```"),
    ],
)
def test_final_answer(text: str, content: str, answer: str) -> None:
    action = FINAL.parse(text)
    assert action.final_answer == answer
    assert action.content == content
    assert action.errors == [] and action.tool_calls == []
    assert action.has_action


def test_no_final_answer_marker() -> None:
    action = FINAL.parse("Still working on it.")
    assert action.final_answer is None and action.content == "Still working on it."


def test_empty_final_answer_is_an_error() -> None:
    action = FINAL.parse("Done.\nFINAL ANSWER:   ")
    assert action.final_answer is None
    assert len(action.errors) == 1 and "no answer" in action.errors[0]


# ------------------------------------------------------------------------------------------ composite


def test_composite_hermes_and_final_answer() -> None:
    parser = build_parser(["hermes", "final_answer"])
    text = 'Check:\n<tool_call>{"name": "calc", "arguments": {"e": "1+1"}}</tool_call>\n<tool_call>{bad}</tool_call>\nFINAL ANSWER: 2'
    action = parser.parse(text, step=1)
    assert _calls(action) == [("calc", {"e": "1+1"})]
    assert action.final_answer == "2"
    assert action.content == "Check:"
    assert len(action.errors) == 1 and "invalid JSON" in action.errors[0]


def test_composite_order_decides_overlapping_formats() -> None:
    text = "```python\nprint('FINAL ANSWER: not this')\n```\nFINAL ANSWER:\n```python\nanswer = 1\n```"
    code_first = build_parser(["python_code", "final_answer"]).parse(text)
    assert _calls(code_first) == [
        ("run_python", {"code": "print('FINAL ANSWER: not this')"}),
        ("run_python", {"code": "answer = 1"}),
    ]
    assert code_first.final_answer is None  # the marker's block was run as code, nothing is left after it
    assert code_first.errors and "no answer" in code_first.errors[0]

    answer_first = build_parser(["final_answer", "python_code"]).parse(text)
    assert answer_first.final_answer == "answer = 1"
    # The first block's marker is inside code, but final_answer read it first: everything before the
    # *last* marker stays content, and python_code runs the block found there.
    assert _calls(answer_first) == [("run_python", {"code": "print('FINAL ANSWER: not this')"})]


def test_composite_ids_are_unique_across_parts() -> None:
    parser = build_parser(["hermes", "python_code", "qwen3_coder"])
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n```python\nb()\n```'
    action = parser.parse(text, step=9)
    assert [call.id for call in action.tool_calls] == ["call_9_0", "call_9_1"]
    # The hermes block was consumed by hermes, so qwen3_coder (later in the list) saw no block.
    assert action.errors == []


def test_composite_needs_parts() -> None:
    with pytest.raises(ConfigError):
        get_parser("composite", parsers=[])
    with pytest.raises(ConfigError):
        get_parser("composite", parsers="hermes")


# ------------------------------------------------------------------------------------ token-id input


class _FakeTokenizer:
    """Decodes ids by table; special tokens are dropped only when asked, like transformers' tokenizers."""

    eos_token = "<|im_end|>"
    pad_token = "<|endoftext|>"
    vocab: ClassVar[dict[int, tuple[str, bool]]] = {
        1: ("<tool_call>", True),
        2: ("</tool_call>", True),
        3: ('{"name": "calc", "arguments": {"e": "2*3"}}', False),
        4: ("Sure. ", False),
        5: ("<|im_end|>", True),
    }

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(
            text for i in ids for text, special in [self.vocab[i]] if not (special and skip_special_tokens)
        )


def test_parse_ids_keeps_special_tool_tokens_and_drops_the_trailing_eos() -> None:
    action = HERMES.parse_ids([4, 1, 3, 2, 5], _FakeTokenizer(), step=2)
    assert _calls(action) == [("calc", {"e": "2*3"})]
    assert action.tool_calls[0].id == "call_2_0"
    assert action.content == "Sure."
