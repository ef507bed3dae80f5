"""Self-Questioning from nothing (issue 43, part 1): no human task, exploration seeds, a sampling explorer,
calc's task writer at every level it can prove, no synthetic task equal to an evaluation task, and a report
that counts it all.

Unit tests pin the pieces where they live (calc's seeds and levels, the seed split); the end-to-end tests run
the real entry point (``python -m agentevolver.module.task_manager --config-name calc_self_questioning``) on
the real calc service, with the explorer played by the scripted OpenAI-compatible server: it reads the
numbers the drawn opening suggests and calls the tools with them, and it calls, in every exploration, one
expression that calc renders as a question of its test or validation split word for word.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from env_service_fixture import REPO_ROOT, env_service
from scripted_openai_server import ScriptedOpenAIServer

from agentevolver.client.env_client import EnvClient
from agentevolver.config import load_config
from agentevolver.embedders import normalize_text
from agentevolver.errors import ConfigError
from agentevolver.module.task_manager import read_objectives, seed_tasks
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.eval_overlap import EvalQueries
from agentevolver.module.task_manager.profile import constrained_tools, load_profile
from agentevolver.module.task_manager.proof import Observation, prove
from agentevolver.schema import ChatMessage
from agentevolver.schema.task_writing import ObservedCall
from env_service.environments.calc import CalcEnv
from env_service.environments.calc.task_writing import render_tasks
from env_service.environments.calc.tasks import LEVELS, CalcTask, get_task, split_task_ids
from env_service.environments.calc.tools import TOOL_SCHEMAS
from env_service.errors import EnvServiceError, UnknownSplit

CALC = load_profile("calc")
PRESET = "calc_self_questioning"
EXPLORING = "You are now EXPLORING this environment"


#: calc's held-out splits (the preset's eval_splits that calc has)
EVAL_SPLITS = [split for split in ("val", "test", "eval") if split in CalcEnv.splits()]


def _evaluation_tasks() -> list[CalcTask]:
    return [get_task(task_id) for split in EVAL_SPLITS for task_id in split_task_ids(split)]


# -- calc's exploration seeds ------------------------------------------------------------------------------------


def test_calc_lists_one_exploration_seed_per_tool_that_plays_like_a_task_and_scores_0() -> None:
    assert CalcEnv.task_ids("explore") == ["explore-calculator", "explore-convert_units"]
    assert "explore" not in CalcEnv.splits()  # a split of seeds, not of tasks (it is accepted all the same)
    env = CalcEnv("explore-calculator", "i-1", {})
    opening = env.reset()
    assert opening[-1].role == "user" and "`calculator`" in opening[-1].content
    outcome = env.step(_call_message("calculator", {"expression": "6 * 7"}))
    assert outcome.state[0].content.strip() == "42" and not outcome.is_terminated
    assert env.evaluate(sparse=False) == 0.0  # a seed has no answer: nothing is right
    assert env.info()["level"] == "seed"


def test_explore_past_answers_keeps_a_seed_going_until_max_steps_and_a_task_still_ends_at_its_answer() -> None:
    answer = ChatMessage(role="assistant", content="FINAL ANSWER: 42")
    default = CalcEnv("explore-calculator", "i-1", {})
    default.reset()
    assert default.step(answer).is_terminated  # as a task: the answer ends it
    seed = CalcEnv("explore-calculator", "i-2", {"explore_past_answers": True, "max_steps": 3})
    seed.reset()
    outcome = seed.step(answer)
    assert not outcome.is_terminated and outcome.info["explore_on"] and "Call a tool again" in outcome.state[0].content
    assert seed.step(_call_message("calculator", {"expression": "6 * 7"})).state[0].content.strip() == "42"
    last = seed.step(answer)
    assert last.is_terminated and last.info["reason"] == "max_steps" and last.reward == 0.0
    task = CalcEnv(split_task_ids("train")[0], "i-3", {"explore_past_answers": True})
    task.reset()
    assert task.step(answer).is_terminated  # only seeds: a task's answer still ends its episode
    with pytest.raises(EnvServiceError, match=r"params\.explore_past_answers must be true or false"):
        CalcEnv("explore-calculator", "i-4", {"explore_past_answers": "yes"})


def test_an_unknown_calc_split_names_the_seed_split_too() -> None:
    with pytest.raises(UnknownSplit, match="'explore' for the exploration seeds"):
        CalcEnv.task_ids("exploration")


# -- calc's task writer at every level --------------------------------------------------------------------------


def _observed(calls: list[tuple[str, dict[str, Any], str]]) -> tuple[list[ObservedCall], list[Observation]]:
    observed = [ObservedCall(tool=tool, arguments=arguments, text=result, call=f"{tool}({json.dumps(arguments)})")
                for tool, arguments, result in calls]
    record = []
    for obs in observed:
        inputs = tuple(float(n) for n in re.findall(r"\d+(?:\.\d+)?", json.dumps(obs.arguments)))
        record.append(Observation(text=obs.text, call=obs.call, inputs=inputs, tool=obs.tool, arguments=obs.arguments))
    return observed, record


def _calculator_calls(count: int) -> list[tuple[str, dict[str, Any], str]]:
    """``count`` one-operation calls over the four operators, with their true results (exact quotients)."""
    calls = []
    for index in range(count):
        a, b = 20 + 7 * index, 3 + index % 9
        operator = "*+-/"[index % 4]
        if operator == "/":
            a = a * b
        value = {"*": a * b, "+": a + b, "-": a - b, "/": a // b}[operator]
        calls.append(("calculator", {"expression": f"{a}{operator}{b}"}, str(value)))
    return calls


def test_the_writer_renders_every_level_it_can_prove_and_records_it() -> None:
    calls = [*_calculator_calls(40),
             ("calculator", {"expression": "(12+5)*3"}, "51"),
             ("convert_units", {"value": 5, "from_unit": "km", "to_unit": "m"}, "5000")]
    observed, record = _observed(calls)
    rendering = render_tasks(observed)
    levels = {task.level for task in rendering.tasks}
    assert levels == set(LEVELS), levels  # single, chain, word, distractor and convert
    for task in rendering.tasks:
        proof = prove(task.query, task.answer, record, CALC.answers)
        assert proof.proved, (task, proof)
    stories = [t for t in rendering.tasks if t.level in ("word", "distractor")]
    assert all(not re.search(r"\d\s*[-+*/]\s*\d", t.query) for t in stories)  # the expression is the agent's to write


def test_all_renderings_writes_every_question_of_each_call_round_by_round() -> None:
    """``task_manager.writer_all_renderings``: each call's digest pick first (as one task a call gives), then
    every other question the call can be; a limit keeps every call's first question before any second."""
    calls = [*_calculator_calls(4), ("calculator", {"expression": "60+7"}, "67")]  # on 20*3's result
    observed, record = _observed(calls)
    one = render_tasks(observed).tasks
    every = render_tasks(observed, all_renderings=True)
    assert len(one) == 5 and every.tasks[:5] == one  # round 1: the digest picks, in call order
    assert len(every.tasks) > 2 * len(one) and len({t.query for t in every.tasks}) == len(every.tasks)
    assert {t.level for t in every.tasks} >= {"single", "chain", "word", "distractor"}
    assert "Multiply 20 by 3, then add 7." in {t.query for t in every.tasks}
    for task in every.tasks:
        proof = prove(task.query, task.answer, record, CALC.answers)
        assert proof.proved, (task, proof)
    limited = render_tasks(observed, all_renderings=True, limit=7)
    assert limited.tasks == every.tasks[:7] and limited.tasks[:5] == one
    assert limited.counts["over_limit"] == len(every.tasks) - 7 and limited.counts["tasks_rendered"] == 7
    # a question equal to the seed's own is dropped alone; the call's other questions stay
    story = next(t for t in every.tasks[5:] if t.level in ("word", "distractor"))
    seeded = render_tasks(observed, all_renderings=True, seed_query=story.query)
    assert seeded.counts["seed_copies"] == 1 and len(seeded.tasks) == len(every.tasks) - 1


def test_a_call_on_an_earlier_result_reads_as_one_two_step_question_proved_through_both_calls() -> None:
    """The first pair (first call, second call on its result) whose digest picks the chain: a worded two-step
    question stating the first call's numbers and the second's, proved by deriving through both calls."""
    for c in range(2, 60):
        calls = [("calculator", {"expression": "12+5"}, "17"), ("calculator", {"expression": f"17*{c}"}, str(17 * c))]
        observed, record = _observed(calls)
        second = render_tasks(observed).tasks[1]
        if second.level == "chain":
            break
    else:
        pytest.fail("no second call was written as a chain")
    assert second.query == f"Add 12 and 5, then multiply the result by {c}."
    assert second.evidence.startswith('calculator({"expression": "12+5"}) -> 17; ')
    proof = prove(second.query, second.answer, record, CALC.answers)
    assert proof.proved and "->" in (proof.call or ""), proof


# -- the seed split -------------------------------------------------------------------------------------------------


def test_the_no_human_task_preset_composes() -> None:
    _cfg, settings = load_config([], config_name=PRESET)
    section = settings.task_manager
    assert (section.seed_split, section.writer, section.n) == ("explore", "env", 8)
    assert section.mixture.use_original_tasks is False and section.mixture.synthetic_data_ratio > 0
    assert "eval_overlap" in section.realtime_filters and section.eval_splits == ["val", "test", "eval"]
    assert section.explorer_temperature and section.explorer_temperature > 0
    assert section.explorer_max_tokens == 128
    assert settings.env_service.train_split == "explore"


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc", tmp_path=tmp_path_factory.mktemp("sq_from_nothing")) as running:
        yield running.url


def test_seeds_come_from_the_seed_split_and_never_from_validation(calc: str) -> None:
    _cfg, settings = load_config([f"env_service.env_url={calc}"], config_name=PRESET)
    with EnvClient.from_config(settings.env_service) as env:
        assert [s.task_id for s in seed_tasks(env, settings)] == ["explore-calculator", "explore-convert_units"]
        _cfg, on_val = load_config([f"env_service.env_url={calc}", "task_manager.seed_split=val/single+chain"],
                                   config_name=PRESET)
        with pytest.raises(ConfigError, match=r"task_manager\.seed_split is the validation split"):
            seed_tasks(env, on_val)


def test_the_evaluation_queries_are_every_val_and_test_task_of_calc(calc: str) -> None:
    _cfg, settings = load_config([f"env_service.env_url={calc}",
                                  f"task_manager.eval_splits=[{','.join(EVAL_SPLITS)},holdout]"], config_name=PRESET)
    with EnvClient.from_config(settings.env_service) as env:
        queries = EvalQueries(TaskManagerDeps(settings, env=env))
        texts = queries.texts()
    expected = {normalize_text(t.query) for t in _evaluation_tasks()}
    assert texts == expected and queries.splits == EVAL_SPLITS  # holdout: calc has none, skipped
    _cfg, none = load_config([f"env_service.env_url={calc}", "task_manager.eval_splits=[holdout]"], config_name=PRESET)
    with EnvClient.from_config(none.env_service) as env, pytest.raises(ConfigError, match=r"task_manager\.eval_splits"):
        EvalQueries(TaskManagerDeps(none, env=env)).texts()


# -- through the command line, from nothing ----------------------------------------------------------------------


def _call_message(tool: str, arguments: dict[str, Any]) -> Any:
    from agentevolver.schema import ChatMessage, ToolCall, ToolFunction

    return ChatMessage(role="assistant", content="", tool_calls=[
        ToolCall(id="c0", function=ToolFunction(name=tool, arguments=json.dumps(arguments)))])


def _eval_call() -> tuple[str, str]:
    """A calculator expression of an evaluation task that calc's writer renders as that task's query, word for
    word (so the only thing between it and training is the eval_overlap filter)."""
    for task in _evaluation_tasks():
        if task.solution["name"] == "calculator":
            expression = task.solution["arguments"]["expression"]
            result = f"{task.answer:.12g}"
            observed = [ObservedCall(tool="calculator", arguments={"expression": expression}, text=result,
                                     call=f"calculator({expression})")]
            rendered = render_tasks(observed).tasks
            if rendered and rendered[0].query == task.query:
                return expression, task.query
    raise AssertionError("no evaluation task is rendered word for word")


EVAL_EXPRESSION, EVAL_QUERY = _eval_call()
_OPENING = re.compile(r"Start [^\n]*?(\d+), (\d+), (\d+)\.")


def _explorer(body: dict[str, Any]) -> str:
    """The explorer: uses the numbers its drawn opening suggests; step k of an exploration makes call k."""
    system = body["messages"][0]["content"]
    if EXPLORING not in system:
        return "not an explorer request"
    match = _OPENING.search(system)
    assert match, system
    a, b, c = (int(n) for n in match.groups())
    messages = body["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user" and "Find out what the tool" in m["content"])
    step = sum(1 for m in messages[start:] if m["role"] == "assistant")  # not the demonstrations' turns
    calls = [("calculator", {"expression": EVAL_EXPRESSION}),
             ("calculator", {"expression": f"{c}*{a}"}),
             ("calculator", {"expression": f"{c}+{b}"}),
             ("calculator", {"expression": f"{c * a}-{b}"}),
             ("convert_units", {"value": a, "from_unit": "km", "to_unit": "m"}),
             ("calculator", {"expression": f"{c}-{a}"})]
    tool, arguments = calls[min(step, len(calls) - 1)]
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"


def _cli(calc: str, scripted: ScriptedOpenAIServer, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    out.mkdir(parents=True, exist_ok=True)
    args = ["--config-name", PRESET, "--no-progress", "--summary-json", str(out / "summary.json"),
            f"env_service.env_url={calc}", "env_service.max_retries=0",
            f"llm.endpoints.local.base_url={scripted.base_url}", "llm.endpoints.local.max_retries=0",
            "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
            f"task_manager.synthetic_tasks_path={out / 'tasks.jsonl'}",
            f"task_manager.checkpoint_path={out / 'checkpoint.json'}",
            "task_manager.n=2", "task_manager.num_explore_threads=2", *extra]
    return subprocess.run([sys.executable, "-m", "agentevolver.module.task_manager", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "400"})  # the table's rows on one line each


def test_cli_writes_tasks_from_exploration_seeds_none_equal_to_an_eval_task_and_reports_it(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(_explorer)
    # one question a call, so every call the explorer made is counted once: written or rejected
    result = _cli(calc, scripted_llm, tmp_path / "seed0", "task_manager.writer_all_renderings=false")
    assert result.returncode == 0, result.stderr + result.stdout

    bodies = scripted_llm.bodies
    assert bodies and all(EXPLORING in b["messages"][0]["content"] for b in bodies)  # no LLM wrote or judged
    assert {b["temperature"] for b in bodies} == {0.8} and len({b["seed"] for b in bodies}) > 1  # it samples
    assert {b["max_tokens"] for b in bodies} == {128}  # task_manager.explorer_max_tokens: one call a reply

    written = read_objectives(tmp_path / "seed0" / "tasks.jsonl")
    assert written and all(o.seed_task_id.startswith("explore-") for o in written)  # no human task anywhere
    queries = [normalize_text(o.task.query or "") for o in written]
    evaluation = {normalize_text(t.query) for t in _evaluation_tasks()}
    assert not set(queries) & evaluation and normalize_text(EVAL_QUERY) not in queries
    assert all(o.task.metadata.get("level") in LEVELS for o in written)
    assert all(o.task.evaluator == "reference" for o in written)

    summary = json.loads((tmp_path / "seed0" / "summary.json").read_text())
    metrics, counts = summary["metrics"], summary["counts"]
    assert metrics["tasks/explorations"] == 4 and summary["seeds"] == 2
    assert metrics["tasks/written"] == len(written) and metrics["tasks/distinct"] == len(set(queries))
    assert metrics["tasks/eval_overlap"] == 0 and summary["eval_splits"] == EVAL_SPLITS
    # every exploration called the evaluation task's expression: rendered 4 times, dropped 4 times
    assert summary["rejected"]["eval_overlap"] == 4 == counts["dropped_eval_overlap"]
    assert sum(summary["levels"].values()) == len(written) and len(summary["levels"]) >= 3, summary["levels"]
    assert metrics["tasks/rejected"] == sum(summary["rejected"].values())
    assert counts["env_calls_seen"] == metrics["tasks/written"] + metrics["tasks/rejected"], (counts, metrics)
    table = " ".join(result.stdout.split())
    assert re.search(r"equal to an eval task\W+0\W+of the written, compared with " + ", ".join(EVAL_SPLITS), table)
    assert "distinct; levels:" in table and "eval_overlap 4" in table


def _answering_explorer(body: dict[str, Any]) -> str:
    """An explorer that answers after every call (as SmolLM2 does): a call with new numbers, then FINAL ANSWER."""
    messages = body["messages"]
    start = max(i for i, m in enumerate(messages) if m["role"] == "user" and "Find out what the tool" in m["content"])
    step = sum(1 for m in messages[start:] if m["role"] == "assistant")
    if step % 2:
        return "FINAL ANSWER: 5"
    expression = f"{31 + 7 * step} * {3 + step}"
    return f"<tool_call>\n{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}\n</tool_call>"


def test_exploration_params_reach_exploration_instances_only_and_keep_a_seed_exploring(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(_answering_explorer)
    steps = {}
    for name, extra in (("plain", []), ("on", ["+task_manager.exploration_params.explore_past_answers=true"])):
        result = _cli(calc, scripted_llm, tmp_path / name, "task_manager.n=1", "task_manager.eval_splits=[]", *extra)
        assert result.returncode == 0, result.stderr + result.stdout
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        steps[name] = (summary["counts"]["explore_steps"], summary["counts"]["env_calls_seen"])
    # 2 seeds: the answer ends each exploration after its one call; kept exploring, each runs its 6 steps
    assert steps == {"plain": (4, 2), "on": (12, 6)}
    _cfg, settings = load_config(["+task_manager.exploration_params.explore_past_answers=true"], config_name=PRESET)
    deps = TaskManagerDeps(settings)
    assert deps.exploration_params == {**deps.create_params, "explore_past_answers": True}
    assert "explore_past_answers" not in deps.create_params  # what training episodes are created with


def test_cli_another_explore_seed_writes_other_tasks(calc: str, scripted_llm: ScriptedOpenAIServer,
                                                     tmp_path: Path) -> None:
    scripted_llm.respond_with(_explorer)
    runs = {}
    for seed in (0, 1):
        result = _cli(calc, scripted_llm, tmp_path / f"seed{seed}", f"task_manager.explore_seed={seed}",
                      "task_manager.eval_splits=[]", "task_manager.realtime_filters=[dedup]")
        assert result.returncode == 0, result.stderr + result.stdout
        runs[seed] = {o.task.query for o in read_objectives(tmp_path / f"seed{seed}" / "tasks.jsonl")}
    assert runs[0] and runs[1] and runs[0] != runs[1]
    # the only task both wrote is the evaluation task's expression (every exploration calls it): with
    # the filter off and no eval splits, nothing stopped it, which is what eval_overlap is for
    assert runs[0] & runs[1] == {EVAL_QUERY}


def test_a_forced_tool_choice_makes_every_step_of_the_real_small_explorer_a_call(calc: str, tmp_path: Path) -> None:
    """The real SmolLM2-135M explorer on the real local server, greedy: left to ``auto`` it answers in prose or
    passes arguments a tool does not take in many explorations (issue 43's explorations log); with
    ``explorer_tool_choice=required`` every step is one call of a calc tool, with exactly that tool's required
    argument names, and the explorations log shows it."""
    from test_llm_server import llm_server

    model = "smollm2-135m-instruct"
    with llm_server(tmp_path, model=model) as running:
        out = tmp_path / "required"
        out.mkdir()
        args = ["--config-name", PRESET, "--no-progress", "--summary-json", str(out / "summary.json"),
                f"env_service.env_url={calc}", f"llm.endpoints.local.base_url={running.base_url}",
                f"llm.endpoints.local.model={model}", "task_manager.explorer_temperature=0",
                f"task_manager.synthetic_tasks_path={out / 'tasks.jsonl'}",
                f"task_manager.checkpoint_path={out / 'checkpoint.json'}", "task_manager.n=1",
                "task_manager.max_explore_step=2", "task_manager.explorer_tool_choice=required"]
        result = subprocess.run([sys.executable, "-m", "agentevolver.module.task_manager", *args], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=1200, env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stderr + result.stdout
    counts = json.loads((out / "summary.json").read_text())["counts"]
    assert counts["explore_steps"] == counts["explore_tool_calls"] == 4  # 2 seeds x 2 steps, a call each
    assert counts.get("explore_without_tool_calls", 0) == 0
    # each call has exactly its tool's arguments, kept to what calc's profile says they look like
    # (tool_arguments: arithmetic only in an expression, calc's units): so every call is one calc can answer
    schemas = {tool["function"]["name"]: tool["function"]["parameters"]
               for tool in constrained_tools(list(TOOL_SCHEMAS), CALC)}
    logged = [json.loads(line) for line in (out / "checkpoint.explorations.jsonl").read_text().splitlines()]
    assert len(logged) == 2
    for entry in logged:
        opening = entry["trajectory"]["metadata"]["opening_len"]
        for message in entry["trajectory"]["messages"][opening:]:
            if message["role"] == "assistant":
                [call] = message["tool_calls"]
                arguments = json.loads(call["function"]["arguments"])
                schema = schemas[call["function"]["name"]]
                assert set(arguments) == set(schema["required"]), call
                jsonschema.validate(arguments, schema)
    assert counts.get("env_calls_failed", 0) == 0 and read_objectives(out / "tasks.jsonl")
