"""The ``calc`` environment: tasks, the safe calculator, tools, and whole episodes (no model involved)."""

from __future__ import annotations

import json
import math
import operator
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentevolver.schema import ChatMessage, ToolCall, ToolFunction
from env_service.environments.calc import CalcEnv
from env_service.environments.calc.answer import parse_final_answer
from env_service.environments.calc.calculator import CalcError, evaluate_expression
from env_service.environments.calc.examples import FAILED_EXAMPLE, SOLVED_EXAMPLE
from env_service.environments.calc.prompts import NUDGE
from env_service.environments.calc.tasks import LEVELS, get_task
from env_service.environments.calc.tools import parse_text_tool_calls, run_tool
from env_service.environments.calc.units import UnitError, convert
from env_service.errors import BadAction, EnvServiceError, UnknownSplit, UnknownTask
from env_service.registry import get_env_class


def _call(name: str, arguments: dict[str, object], call_id: str = "c1") -> ChatMessage:
    return ChatMessage(role="assistant", content="",
                       tool_calls=[ToolCall(id=call_id, function=ToolFunction(name=name, arguments=arguments))])


def _say(text: str) -> ChatMessage:
    return ChatMessage(role="assistant", content=text)


def _env(task_id: str = "train-single-000", **params: object) -> CalcEnv:
    env = CalcEnv(task_id, "i1", dict(params))
    env.reset()
    return env


# ------------------------------------------------------------------------------------------ tasks
def test_registered_under_calc() -> None:
    assert get_env_class("calc") is CalcEnv


def test_split_sizes_and_level_mix() -> None:
    sizes = {split: len(CalcEnv.task_ids(split)) for split in CalcEnv.splits()}
    assert sizes["train"] >= 200 and sizes["val"] >= 50 and sizes["test"] >= 50
    for split in CalcEnv.splits():
        levels = Counter(get_task(task_id).level for task_id in CalcEnv.task_ids(split))
        assert set(levels) == set(LEVELS)


def test_splits_are_disjoint_in_ids_queries_and_problems() -> None:
    seen_ids: set[str] = set()
    seen_queries: set[str] = set()
    seen_problems: set[tuple[str, str]] = set()
    for split in CalcEnv.splits():
        tasks = [get_task(task_id) for task_id in CalcEnv.task_ids(split)]
        ids = {task.task_id for task in tasks}
        queries = {task.query for task in tasks}
        problems = {(task.level, repr(sorted(task.solution["arguments"].items()))) for task in tasks}
        assert len(ids) == len(queries) == len(tasks), f"duplicates inside {split}"
        assert not ids & seen_ids and not queries & seen_queries and not problems & seen_problems
        seen_ids |= ids
        seen_queries |= queries
        seen_problems |= problems


def test_generation_is_deterministic_across_processes() -> None:
    # Task ids must mean the same task in every process (trainer, service, evaluation): regenerate in a
    # fresh interpreter with a different hash seed and compare.
    import os
    import subprocess
    import sys

    code = ("import json; from env_service.environments.calc.tasks import SPLITS, get_task, split_task_ids; "
            "print(json.dumps([[t, get_task(t).query, get_task(t).answer] for s in SPLITS "
            "for t in split_task_ids(s)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    here = [[t, get_task(t).query, get_task(t).answer] for s in CalcEnv.splits() for t in CalcEnv.task_ids(s)]
    assert json.loads(out) == here


def test_every_reference_solution_solves_its_task() -> None:
    for split in CalcEnv.splits():
        for task_id in CalcEnv.task_ids(split):
            task = get_task(task_id)
            result = run_tool(task.solution["name"], task.solution["arguments"])
            assert result.ok and task.is_correct(result.value), (task, result)


def test_unknown_task_and_split() -> None:
    with pytest.raises(UnknownTask) as err:
        CalcEnv("train-single-999", "i1", {})
    assert err.value.field == "task_id"
    for bad in ("dev", "train/", "train/hard", "train/single+single", "dev/single"):
        with pytest.raises(UnknownSplit) as split_err:
            CalcEnv.task_ids(bad)
        assert split_err.value.field == "params.split" and "levels of single" in str(split_err.value)


def test_level_filtered_split_keeps_the_splits_order() -> None:
    easy = CalcEnv.task_ids("val/single+chain")
    assert easy == [t for t in CalcEnv.task_ids("val") if t.split("-")[1] in {"single", "chain"}]
    assert len(easy) == 30 and CalcEnv.task_ids("train/chain+single") == CalcEnv.task_ids("train/single+chain")


@pytest.mark.parametrize("params", [{"max_steps": 0}, {"max_steps": "6"}, {"demos": 99}, {"demos": True},
                                    {"sparse_reward": "yes"}])
def test_bad_params_name_the_field(params: dict[str, object]) -> None:
    with pytest.raises(EnvServiceError) as err:
        CalcEnv("train-single-000", "i1", params)
    assert err.value.field == f"params.{next(iter(params))}"


# ------------------------------------------------------------------------------------- calculator
@st.composite
def _expressions(draw: st.DrawFn, depth: int = 3) -> tuple[str, float | None]:
    """A random expression and its value computed with Python operators (None: division by zero)."""
    if depth == 0 or draw(st.booleans()):
        number = draw(st.integers(min_value=0, max_value=99))
        return (f"-{number}", float(-number)) if draw(st.booleans()) else (str(number), float(number))
    left_text, left = draw(_expressions(depth - 1))
    right_text, right = draw(_expressions(depth - 1))
    symbol, function = draw(st.sampled_from([("+", operator.add), ("-", operator.sub),
                                             ("*", operator.mul), ("/", operator.truediv)]))
    text = f"({left_text} {symbol} {right_text})"
    if left is None or right is None or (symbol == "/" and right == 0):
        return text, None
    return text, function(left, right)


@given(_expressions())
def test_calculator_matches_python_arithmetic(case: tuple[str, float | None]) -> None:
    text, expected = case
    if expected is None:
        with pytest.raises(CalcError, match="division by zero"):
            evaluate_expression(text)
    else:
        assert math.isclose(evaluate_expression(text), expected, rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize(("expression", "value"), [
    ("2 ** 10", 1024), ("-3 ** 2", -9), ("(-3) ** 2", 9), ("84 / 4", 21), ("7 / 2", 3.5), ("2 ^ 3", 8),
    ("6 × 7", 42), ("9 ÷ 3", 3), ("1.5 * 4", 6), ("12 * 31 =", 372), ("+5", 5), ("2 ** -1", 0.5),
])
def test_calculator_values(expression: str, value: float) -> None:
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(("expression", "reason"), [
    ("__import__('os').system('true')", "not allowed"),
    ("x + 1", "unknown name 'x'"),
    ("abs(-3)", "function calls are not allowed"),
    ("(1).real", "Attribute is not allowed"),
    ("[1, 2][0]", "not allowed"),
    ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"),
    ("1 < 2", "not allowed"),
    ("7 // 2", "'//' is not supported"),
    ("7 % 2", "'%' is not supported"),
    ("9 ** 9 ** 9", "too large"),
    ("10 ** 16", "limit"),
    ("0.001 ** -50", "limit"),
    ("99999999 * 99999999", "limit"),
    ("1 / 0", "division by zero"),
    ("5 / (3 - 3)", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 +", "cannot parse"),
    ("", "empty"),
    ("(" * 300 + "1" + ")" * 300, "longer than"),
    ("1,000 + 1", "not allowed"),
])
def test_calculator_rejects(expression: str, reason: str) -> None:
    with pytest.raises(CalcError, match=reason.replace("(", r"\(").replace("*", r"\*")):
        evaluate_expression(expression)


def test_unit_conversion() -> None:
    assert convert(2.5, "km", "m") == 2500
    assert math.isclose(convert(212, "F", "C"), 100)
    assert math.isclose(convert(1, "Miles", "kilometers"), 1.609344)
    assert math.isclose(convert(0, "degrees Celsius", "fahrenheit"), 32)
    with pytest.raises(UnitError, match="cannot convert length"):
        convert(1, "km", "kg")
    with pytest.raises(UnitError, match="unknown unit 'parsec'"):
        convert(1, "parsec", "m")


# ------------------------------------------------------------------------------------------ tools
@pytest.mark.parametrize(("name", "arguments", "fragment"), [
    ("calculator", {"expr": "1 + 1"}, 'takes one argument, "expression"'),
    ("calculator", {}, "got no arguments"),
    ("calculator", {"expression": "1 + 1", "precision": 2}, '"precision"'),
    ("calculator", {"expression": "import os"}, "cannot parse"),
    ("calculator", "not json", "not valid JSON"),
    ("calculator", [1, 2], "must be a JSON object"),
    ("web_search", {"query": "1+1"}, "unknown tool 'web_search'"),
    ("convert_units", {"value": "lots", "from_unit": "km", "to_unit": "m"}, '"value" must be a number'),
    ("convert_units", {"value": 1, "from_unit": "km", "to_unit": "kg"}, "cannot convert"),
    ("convert_units", {"amount": 1, "from": "km", "to": "m"}, 'convert_units takes "value"'),
])
def test_tool_errors_are_results_not_exceptions(name: str, arguments: object, fragment: str) -> None:
    result = run_tool(name, arguments)  # type: ignore[arg-type]
    assert not result.ok
    assert result.text.startswith("Error: ") and fragment in result.text


def test_tool_leniency() -> None:
    assert run_tool("calculator", {"expression": 42}).text == "42"
    assert run_tool("calculator", '{"expression": "6 * 7"}').text == "42"
    assert run_tool("convert_units", {"value": "2.5", "from_unit": "Kilometers", "to_unit": "m"}).text == "2500"


def test_tool_schemas_are_openai_functions() -> None:
    schemas = CalcEnv.tool_schemas()
    assert [s["function"]["name"] for s in schemas] == ["calculator", "convert_units"]
    for schema in schemas:
        assert schema["type"] == "function"
        parameters = schema["function"]["parameters"]
        assert parameters["type"] == "object" and set(parameters["required"]) <= set(parameters["properties"])
    schemas[0]["function"]["name"] = "mutated"
    assert CalcEnv.tool_schemas()[0]["function"]["name"] == "calculator"


def test_text_tool_call_parsing() -> None:
    calls, problems = parse_text_tool_calls(
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"3 * 3\\"}"}')  # unclosed
    assert [(c.name, c.arguments) for c in calls] == [("calculator", {"expression": "2 + 2"}),
                                                      ("calculator", {"expression": "3 * 3"})]
    assert problems == []
    calls, problems = parse_text_tool_calls("<tool_call>{name: calculator}</tool_call>")
    assert calls == [] and "not valid JSON" in problems[0]


@pytest.mark.parametrize(("text", "value"), [
    ("FINAL ANSWER: 372", 372), ("final answer = -46", -46), ("FINAL ANSWER: 3,500 m", 3500),
    ("So the FINAL ANSWER: **2.5**", 2.5), ("FINAL ANSWER: $12", 12), ("Final answer is 7.", 7),
    ("FINAL ANSWER: 1.5e3", 1500), ("FINAL ANSWER: unknown", None), ("the answer is 5", None),
    ("FINAL ANSWER: 4 FINAL ANSWER: 5", 4),
])
def test_final_answer_parsing(text: str, value: float | None) -> None:
    assert parse_final_answer(text) == value


# --------------------------------------------------------------------------------------- episodes
def test_reset_opens_with_demonstrations_then_the_question() -> None:
    env = CalcEnv("val-word-003", "i1", {})
    state = env.reset()
    assert state[0].role == "system" and "FINAL ANSWER" in state[0].content
    assert state[-1].role == "user" and state[-1].content == get_task("val-word-003").query
    demo = state[1:-1]
    assert demo and len(demo) % 4 == 0
    assert [m.role for m in demo[:4]] == ["user", "assistant", "tool", "assistant"]
    assert demo[1].tool_calls and demo[2].tool_call_id == demo[1].tool_calls[0].id
    assert len(CalcEnv("val-word-003", "i1", {"demos": 0}).reset()) == 2


def _replay(example: dict[str, object]) -> CalcEnv:
    env = _env(str(example["task_id"]))
    for action in example["actions"]:  # type: ignore[attr-defined]
        outcome = env.step(ChatMessage.model_validate(action))
    assert outcome.is_terminated
    return env


def test_solved_example_scores_one() -> None:
    env = _replay(SOLVED_EXAMPLE)
    assert env.evaluate(sparse=True) == SOLVED_EXAMPLE["expected_score"] == 1.0
    assert env.evaluate(sparse=False) == 1.0


def test_failed_example_scores_zero_but_dense_credits_the_tool_result() -> None:
    env = _replay(FAILED_EXAMPLE)
    assert env.evaluate(sparse=True) == FAILED_EXAMPLE["expected_score"] == 0.0
    assert env.evaluate(sparse=False) == 0.5


@pytest.mark.parametrize(("sparse_reward", "expected"), [(False, 0.5), (True, 0.0)])
def test_terminal_step_reward_is_the_score(sparse_reward: bool, expected: float) -> None:
    env = _env(str(FAILED_EXAMPLE["task_id"]), sparse_reward=sparse_reward)
    rewards = [env.step(ChatMessage.model_validate(action)).reward for action in FAILED_EXAMPLE["actions"]]
    assert rewards == [0.0, expected]


def test_full_episode_with_tool_calls() -> None:
    task = get_task("train-chain-000")
    env = _env(task.task_id)
    first = env.step(_call("calculator", task.solution["arguments"], call_id="abc"))
    assert not first.is_terminated and first.reward == 0.0
    [tool_message] = first.state
    assert tool_message.role == "tool" and tool_message.tool_call_id == "abc"
    assert float(tool_message.content) == task.answer
    last = env.step(_say(f"FINAL ANSWER: {tool_message.content}"))
    assert last.is_terminated and last.state == [] and last.reward == last.info["score"] == 1.0
    assert env.evaluate(sparse=True) == 1.0
    info = env.info()
    assert info["level"] == "chain" and info["terminated"] and "answer" not in info
    with pytest.raises(BadAction) as err:
        env.step(_say("FINAL ANSWER: 1"))
    assert err.value.field == "messages"


def test_answer_without_tool_counts_and_wrong_answer_fails() -> None:
    task = get_task("train-single-001")
    assert _run_answer(task.task_id, f"FINAL ANSWER: {task.answer:g}") == 1.0
    assert _run_answer(task.task_id, f"FINAL ANSWER: {task.answer + 1:g}") == 0.0
    assert _run_answer(task.task_id, "FINAL ANSWER: no idea") == 0.0


def _run_answer(task_id: str, text: str) -> float:
    env = _env(task_id)
    assert env.step(_say(text)).is_terminated
    return env.evaluate(sparse=True)


def test_conversion_tolerance() -> None:
    task = next(get_task(t) for t in CalcEnv.task_ids("train")
                if get_task(t).level == "convert" and get_task(t).tolerance > 0.001)
    assert _run_answer(task.task_id, f"FINAL ANSWER: {task.answer * 1.005:.2f}") == 1.0
    assert _run_answer(task.task_id, f"FINAL ANSWER: {task.answer * 1.05:.2f}") == 0.0


def test_text_form_tool_call_is_accepted() -> None:
    task = get_task("train-single-002")
    env = _env(task.task_id)
    call = json.dumps({"name": "calculator", "arguments": task.solution["arguments"]})
    text = f"<tool_call>\n{call}\n</tool_call>"
    outcome = env.step(_say(text))
    assert not outcome.is_terminated and outcome.info["text_tool_calls"]
    assert [m.role for m in outcome.state] == ["tool"] and float(outcome.state[0].content) == task.answer
    unreadable = env.step(_say("<tool_call>{oops</tool_call>"))
    assert unreadable.state[0].role == "user" and "could not be read" in unreadable.state[0].content


def test_tool_call_wins_over_a_premature_final_answer() -> None:
    env = _env()
    outcome = env.step(_say('<tool_call>{"name": "calculator", "arguments": {"expression": "1 + 1"}}'
                            "</tool_call> FINAL ANSWER: 2"))
    assert not outcome.is_terminated and outcome.state[0].content == "2"


def test_tool_errors_keep_the_episode_going() -> None:
    env = _env()
    outcome = env.step(_call("calculator", {"formula": "1 + 1"}))
    assert not outcome.is_terminated and outcome.info["tool_errors"] == 1
    assert outcome.state[0].content.startswith("Error: ")


def test_text_without_final_answer_is_nudged() -> None:
    env = _env()
    outcome = env.step(_say("Let me think about it."))
    assert not outcome.is_terminated and outcome.state == [ChatMessage(role="user", content=NUDGE)]


def test_max_steps_terminates() -> None:
    env = _env(max_steps=3)
    outcomes = [env.step(_say("hmm")) for _ in range(3)]
    assert [o.is_terminated for o in outcomes] == [False, False, True]
    assert outcomes[-1].info["reason"] == "max_steps" and outcomes[-1].info["score"] == 0.0
    assert env.evaluate(sparse=True) == 0.0 and not env.info()["answered"]


def test_non_assistant_action_is_rejected() -> None:
    with pytest.raises(BadAction) as err:
        _env().step(ChatMessage(role="user", content="FINAL ANSWER: 1"))
    assert err.value.field == "messages"


# ------------------------------------------------------------------------------ with the real model
@pytest.mark.slow
def test_builtin_model_solves_single_tasks_greedily() -> None:
    """The opening still works on the real model: greedy SmolLM2 solved 29/29 `single` tasks in the baseline.

    Replies go to the environment as raw text, so this also exercises the lenient ``<tool_call>`` path.
    """
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentevolver.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    envs = [CalcEnv(task_id, f"slow-{i}", {}) for i, task_id in enumerate(CalcEnv.task_ids("train")[:6])]
    conversations = [env.reset() for env in envs]
    for _ in range(2):
        live = [i for i, env in enumerate(envs) if not env.terminated]
        prompts = [tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in conversations[i]],
                                                 tools=CalcEnv.tool_schemas(), add_generation_prompt=True,
                                                 tokenize=False) for i in live]
        batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            output = model.generate(**batch, max_new_tokens=48, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)
        for i, row in zip(live, output[:, batch["input_ids"].shape[1]:], strict=True):
            reply = _say(tokenizer.decode(row, skip_special_tokens=True))
            conversations[i] += [reply, *envs[i].step(reply).state]
    assert all(get_task(env.task_id).level == "single" for env in envs)
    assert sum(env.evaluate(sparse=True) for env in envs) >= 5
