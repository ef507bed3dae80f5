"""``task_manager.writer: env``: the environment writes tasks from an exploration, no LLM.

Through the real entry point (``python -m agentevolver.module.task_manager``) on the real ``calc`` service,
with the explorer played by the scripted OpenAI-compatible server (which records every request): the tasks
written are the calls the explorer made, their answers the observed results, proved by the same check as
an LLM's; no request reaches the task writer (or the judge). The rendering is the environment's capability
``task_writing`` (``POST /task_writing``), tested through the service; an environment without it, or a
profile without ``answers``, is a clear error. Unit tests pin calc's rendering rules where they live
(:mod:`env_service.environments.calc.task_writing`): expression kinds, failed calls, repeats, seed copies, limits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from env_service_fixture import REPO_ROOT, env_service
from scripted_openai_server import ScriptedOpenAIServer

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings
from agentevolver.config import load_config
from agentevolver.errors import ConfigError
from agentevolver.module.task_manager import read_objectives, seed_tasks
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.env_writer import EnvWriter, observed_calls
from agentevolver.module.task_manager.profile import ProfileError, load_profile
from agentevolver.module.task_manager.prompts import FILTER_SYSTEM, SUMMARIZER_SYSTEM
from agentevolver.module.task_manager.proof import observations, prove
from agentevolver.schema import ChatMessage, Task, ToolCall, ToolFunction, Trajectory
from agentevolver.schema.task_writing import RENDER_COUNTS
from agentevolver.verl.task_dataset import tasks_from_env_service
from env_service.environments.calc.task_writing import format_expression, render_tasks

CALC = load_profile("calc")
EXPLORING = "You are now EXPLORING this environment"

# -- calc's rendering ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("written", "rendered"), [
    ("17*23", "17 * 23"),
    ("12*(3+4)", "12 * (3 + 4)"),
    ("  258 /6 ", "258 / 6"),
    ("2**10", "2 ** 10"),
    ("-5+3", "-5 + 3"),
    ("(12 - 3)/ -3", "(12 - 3) / -3"),
    ("3×4", "3 × 4"),
    ("17 * 23 =", "17 * 23"),
    ("1.5e3*2", "1.5e3 * 2"),
])
def test_expressions_are_written_like_the_environments_own_tasks(written: str, rendered: str) -> None:
    assert format_expression(written) == rendered


def _trajectory(calls: list[tuple[str, dict[str, Any], str]], query: str = "What is 65 - 59?") -> Trajectory:
    """An exploration of a seed task stating ``query``: each (tool, arguments, result) as call + tool message,
    then a nudge holding a number and a final answer (neither is a tool result)."""
    messages = [ChatMessage(role="system", content="You are a math assistant. Example: 12 * 31 -> 372."),
                ChatMessage(role="user", content=query)]
    for index, (tool, arguments, result) in enumerate(calls):
        call = ToolCall(id=f"c{index}", function=ToolFunction(name=tool, arguments=json.dumps(arguments)))
        messages += [ChatMessage(role="assistant", content="", tool_calls=[call]),
                     ChatMessage(role="tool", content=result, tool_call_id=f"c{index}", name=tool)]
    messages += [ChatMessage(role="user", content="Reply with FINAL ANSWER: 99."),
                 ChatMessage(role="assistant", content="FINAL ANSWER: 99")]
    return Trajectory(task_id="train-single-000", rollout_id=0, env_type="calc", query=query, messages=messages,
                      metadata={"opening_len": 2, "query_index": 1})


CALLS = [
    ("calculator", {"expression": "17*23"}, "391"),
    ("calculator", {"expression": "1/0"}, "Error: division by zero."),
    ("calculator", {"expression": "391 - 100"}, "291"),
    ("calculator", {"expression": "17 * 23"}, "391"),  # the first call again, spelled differently
    ("convert_units", {"value": 5, "from_unit": "km", "to_unit": "m"}, "5000"),
    ("convert_units", {"value": "x", "from_unit": "km", "to_unit": "m"}, 'Error: "value" must be a number.'),
    ("calculator", {"expression": "(2.5+0.5)/4"}, "0.75"),
    ("calculator", {"expression": "2**10"}, "1024"),
    ("calculator", {"expression": "50 - 80"}, "-30"),
    ("lookup", {"key": "pi"}, "3.14159"),  # a tool the profile gives no template
    ("calculator", {"expression": "65 - 59"}, "6"),  # the seed task itself
]


def test_each_successful_call_becomes_a_task_with_the_observed_result_as_its_proved_answer() -> None:
    trajectory = _trajectory(CALLS)
    record = observations(trajectory)
    rendering = render_tasks(observed_calls(trajectory), seed_query=trajectory.query)

    rendered = {task.answer: task.query for task in rendering.tasks}
    assert list(rendered) == ["391", "291", "5000", "0.75", "1024", "-30"]
    # a restatement, or (calc's levels: env_service/environments/calc/stories.py) a story stating 17 and 23
    assert rendered["391"] in ("What is 17 * 23?", "Calculate 17 * 23.", "Compute 17 * 23.",
                               "What is the value of 17 * 23?") or {"17", "23"} <= set(rendered["391"].split())
    assert "(2.5 + 0.5) / 4" in rendered["0.75"] and "2 ** 10" in rendered["1024"]
    assert rendered["5000"] in ("How many meters are in 5 kilometers?", "Convert 5 kilometers to meters.",
                                "What is 5 kilometers in meters?")
    assert dict(rendering.counts) == {"calls_seen": 11, "calls_failed": 2, "calls_merged": 1,
                                      "calls_not_rendered": 1, "seed_copies": 1, "tasks_rendered": 6}
    first = rendering.tasks[0]
    assert first.evidence == 'calculator({"expression": "17*23"}) -> 391'
    # every rendered task passes the proof check an LLM writer's tasks go through, unrelaxed
    for task in rendering.tasks:
        assert prove(task.query, task.answer, record, CALC.answers).proved, task


def test_rendering_is_reproducible_and_capped_like_the_llm_writer() -> None:
    trajectory = _trajectory(CALLS)
    calls = observed_calls(trajectory)
    once = render_tasks(calls, seed_query=trajectory.query)
    again = render_tasks(calls, seed_query=trajectory.query)
    assert once.tasks == again.tasks
    capped = render_tasks(calls, seed_query=trajectory.query, limit=2)
    assert [t.answer for t in capped.tasks] == ["391", "291"] and capped.counts["over_limit"] == 4


def test_a_rendering_of_the_seed_task_in_another_template_is_still_a_seed_copy() -> None:
    for seed_query in ("What is 65 - 59?", "Compute 65 - 59.", "calculate 65 - 59"):
        rendering = render_tasks(observed_calls(_trajectory(CALLS[-1:], seed_query)), seed_query=seed_query)
        assert (rendering.tasks, rendering.counts["seed_copies"]) == ([], 1)


def test_a_result_the_proof_rejects_is_rendered_but_never_kept() -> None:
    """The proof is not relaxed for the environment: "What is 7 * 1?" states its own answer."""
    trajectory = _trajectory([("calculator", {"expression": "7*1"}, "7")])
    record = observations(trajectory)
    (task,) = render_tasks(observed_calls(trajectory)).tasks
    proof = prove(task.query, task.answer, record, CALC.answers)
    assert (proof.proved, proof.reason) == (False, "answer_in_query")


# -- the profile -----------------------------------------------------------------------------------------------


def _profile_file(tmp_path: Path, **changes: Any) -> Path:
    raw = json.loads((REPO_ROOT / "agentevolver/module/task_manager/profiles/calc.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    path = tmp_path / "calc_profile.json"
    path.write_text(json.dumps(raw))
    return path


def test_the_rendering_is_no_longer_profile_data(tmp_path: Path) -> None:
    """calc's templates live with calc (capability task_writing); an old profile's env_writer is named as unknown."""
    old = {"calls": {"calculator": {"templates": ["What is {expression}?"]}}}
    with pytest.raises(ProfileError, match=r"calc_profile\.json") as caught:
        load_profile("calc", _profile_file(tmp_path, env_writer=old))
    assert "env_writer: Extra inputs are not permitted" in str(caught.value)


def test_the_writer_key_takes_only_env_or_llm() -> None:
    with pytest.raises(ConfigError, match=r"task_manager\.writer"):
        load_config(["task_manager.writer=model"])


# -- through the command line on the real calc service ---------------------------------------------------------


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc,echo", tmp_path=tmp_path_factory.mktemp("calc_env_writer")) as running:
        yield running.url


# -- the capability, through the service -----------------------------------------------------------------------


def test_calc_advertises_task_writing_and_renders_through_the_service(calc: str) -> None:
    trajectory = _trajectory(CALLS)
    with EnvClient(EnvClientSettings(env_url=calc, max_retries=0)) as env:
        assert "task_writing" in env.capabilities("calc") and env.capabilities("echo") == []
        data = env.write_tasks("calc", observed_calls(trajectory), seed_query=trajectory.query, limit=5)
    # the same rendering as calc's rules give in-process, over the wire
    assert data.tasks == render_tasks(observed_calls(trajectory), seed_query=trajectory.query, limit=5).tasks
    assert data.env_type == "calc" and [t.answer for t in data.tasks] == ["391", "291", "5000", "0.75", "1024"]
    assert data.counts == {"calls_seen": 11, "calls_failed": 2, "calls_merged": 1, "calls_not_rendered": 1,
                           "seed_copies": 1, "over_limit": 1, "tasks_rendered": 5}
    assert set(data.counts) <= set(RENDER_COUNTS)
    schema = httpx.get(f"{calc}/openapi.json").json()
    assert "TaskWritingAnswer" in schema["components"]["schemas"]


def test_an_environment_without_task_writing_answers_capability_unsupported(calc: str) -> None:
    with EnvClient(EnvClientSettings(env_url=calc, max_retries=0)) as env, pytest.raises(EnvClientError) as err:
        env.write_tasks("echo", [])
    assert (err.value.status, err.value.code, err.value.field) == (400, "capability_unsupported", "env_type")
    assert "'echo'" in str(err.value) and "'task_writing'" in str(err.value) and "task_manager.writer" in str(err.value)
    bad = httpx.post(f"{calc}/task_writing", json={"env_type": "calc", "calls": [], "limit": -1})
    assert (bad.status_code, bad.json()["error"]["field"]) == (422, "limit")


def test_writer_env_on_an_environment_without_the_capability_is_a_config_error(calc: str) -> None:
    _cfg, settings = load_config(["env_service.env_type=echo", f"env_service.env_url={calc}",
                                  "task_manager.writer=env"])
    with EnvClient.from_config(settings.env_service) as env, pytest.raises(ConfigError) as caught:
        EnvWriter(TaskManagerDeps(settings, env=env, given_profile=CALC))
    text = str(caught.value)
    assert "task_manager.writer is 'env'" in text and "'task_writing'" in text and "task_manager.writer=llm" in text


def test_a_service_error_skips_the_exploration_and_is_counted(calc: str) -> None:
    _cfg, settings = load_config(["env_service.env_type=calc", f"env_service.env_url={calc}",
                                  "task_manager.writer=env"])
    with EnvClient.from_config(settings.env_service) as env:
        writer = EnvWriter(TaskManagerDeps(settings, env=env))
    # the service is gone by the time the exploration is rendered: nothing listens on port 9 (discard)
    with EnvClient(EnvClientSettings(env_url="http://127.0.0.1:9", max_retries=0)) as gone:
        writer.env = gone
        outcome = writer.summarize(Task(task_id="train-single-000", env_type="calc"), _trajectory(CALLS))
    assert outcome.objectives == [] and outcome.rendered == {"service_errors": 1}
    assert outcome.errors and outcome.errors[0].startswith("task_writing failed")


#: What the scripted explorer does, one call per step (calc ends an episode after 4 steps).
EXPLORER_STEPS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call>',
    '<tool_call>\n{"name": "convert_units", "arguments": {"value": 5, "from_unit": "km", "to_unit": "m"}}\n</tool_call>',
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>',
]


def _explorer(body: dict[str, Any]) -> str:
    """Plays only the explorer: its n-th reply in an exploration is EXPLORER_STEPS[n]. Any other role's
    request gets an error reply (and is recorded, so the test sees it)."""
    system = body["messages"][0]["content"]
    if EXPLORING not in system or system.startswith((SUMMARIZER_SYSTEM, FILTER_SYSTEM)):
        return "not an explorer request"
    done = sum(1 for m in body["messages"] if m["role"] == "assistant" and m["content"] in EXPLORER_STEPS)
    return EXPLORER_STEPS[min(done, len(EXPLORER_STEPS) - 1)]


def _cli(calc: str, scripted: ScriptedOpenAIServer, tmp_path: Path, *extra: str,
         options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [*options, "--no-progress", "--summary-json", str(tmp_path / "summary.json"),
            "env_service.env_type=calc", f"env_service.env_url={calc}", "env_service.max_retries=0",
            f"llm.endpoints.local.base_url={scripted.base_url}", "llm.endpoints.local.max_retries=0",
            "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
            f"task_manager.synthetic_tasks_path={tmp_path / 'tasks.jsonl'}",
            f"task_manager.checkpoint_path={tmp_path / 'checkpoint.json'}",
            "task_manager.n=1", "task_manager.num_seed_tasks=2", "task_manager.max_explore_step=4",
            "task_manager.num_explore_threads=1", "task_manager.tasks_per_exploration=3", *extra]
    return subprocess.run([sys.executable, "-m", "agentevolver.module.task_manager", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


def test_cli_writer_env_writes_the_observed_calls_as_proved_tasks_without_asking_the_writer(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(_explorer)
    result = _cli(calc, scripted_llm, tmp_path, "task_manager.writer=env")
    assert result.returncode == 0, result.stderr + result.stdout

    # every request was the explorer's: none reached the task writer, none the feasibility judge
    bodies = scripted_llm.bodies
    assert bodies and all(EXPLORING in b["messages"][0]["content"] for b in bodies)
    assert not any(b["messages"][0]["content"].startswith((SUMMARIZER_SYSTEM, FILTER_SYSTEM)) for b in bodies)

    written = read_objectives(tmp_path / "tasks.jsonl")
    assert len(written) == 4  # 2 seeds x (17 * 23, 5 km in m); the error and the repeat skipped
    by_answer: dict[str, list[Any]] = {}
    for objective in written:
        by_answer.setdefault(objective.task.ground_truth, []).append(objective)
    assert sorted(by_answer) == ["391", "5000"] and all(len(v) == 2 for v in by_answer.values())
    for objective in written:
        task = objective.task
        assert task.evaluator == "reference" and objective.source == "synthetic"
        assert task.task_id.startswith(f"{objective.seed_task_id}~syn-")
        # the answer is what the calculator returned, and the proof names the call that returned it
        assert task.metadata["evidence"].endswith(f"-> {task.ground_truth}")
        assert task.metadata["proof"]["observation"].strip() == task.ground_truth
    assert {o.task.query for o in by_answer["5000"]} <= {"How many meters are in 5 kilometers?",
                                                         "Convert 5 kilometers to meters.", "What is 5 kilometers in meters?"}
    # a restatement or a story stating both numbers (calc's levels: env_service/environments/calc/stories.py)
    assert all(o.task.query in {"What is 17 * 23?", "Calculate 17 * 23.", "Compute 17 * 23.",
                                "What is the value of 17 * 23?"} or {"17", "23"} <= set(o.task.query.split())
               for o in by_answer["391"])

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["writer"].startswith("env: the calc environment renders")
    counts = summary["counts"]
    assert (counts["env_calls_seen"], counts["env_calls_failed"], counts["env_calls_merged"]) == (8, 2, 2)
    assert (counts["answers_checked"], counts["answers_proved"], counts["judged_without_llm"]) == (4, 4, 4)
    assert counts.get("summary_replies", 0) == 0 and summary["rates"]["proof_rate"] == 1.0
    assert summary["rates"]["parse_rate"] is None and summary["rates"]["reasks_per_exploration"] is None
    table = " ".join(result.stdout.split())
    assert "task writer" in table and "env: the calc environment" in table and "no LLM request" in table


def test_cli_report_names_the_llm_writer_model(calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    """The same run with the default writer: the report names the model that played the role."""
    def roles(body: dict[str, Any]) -> str:
        if body["messages"][0]["content"].startswith(SUMMARIZER_SYSTEM):
            return json.dumps({"tasks": [{"query": "What is 17 multiplied by 23?", "answer": "391", "evidence": "391"}]})
        return _explorer(body)

    scripted_llm.respond_with(roles)
    result = _cli(calc, scripted_llm, tmp_path, "task_manager.num_seed_tasks=1", "task_manager.max_explore_step=1")
    assert result.returncode == 0, result.stderr + result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["writer"] == "llm: smollm2-135m-instruct (llm.roles.task_summarizer -> endpoint local)"
    assert summary["counts"]["answers_proved"] == 1
    assert "llm: smollm2-135m-instruct" in " ".join(result.stdout.split())


def test_cli_writer_env_on_a_profile_without_answers_exits_2_naming_the_key_and_the_profile(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    """A rendered task is trusted only once proved, so the env writer needs the profile's proof rules."""
    scripted_llm.respond_with(_explorer)
    path = _profile_file(tmp_path, answers=None)
    result = _cli(calc, scripted_llm, tmp_path, "task_manager.writer=env", f"task_manager.env_profile={path}")
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "task_manager.writer is 'env'" in message and "calc_profile.json" in message and "answers" in message
    assert not scripted_llm.requests  # it stopped before exploring


def test_the_few_seed_regime_seeds_are_the_capped_training_tasks(calc: str) -> None:
    """``task_manager.num_seed_tasks=8`` explores exactly the 8 tasks ``data.train_max_samples=8`` trains on
    (both spread over env_service.train_split), so "8 originals + synthetic" and "the same 8 alone" differ only
    in the synthetic tasks (docs/task_manager.md, "The few-seed regime")."""
    _cfg, settings = load_config(["env_service.env_type=calc", f"env_service.env_url={calc}",
                                  "task_manager.num_seed_tasks=8", "data.train_max_samples=8"])
    with EnvClient.from_config(settings.env_service) as env:
        seeds = [s.task_id for s in seed_tasks(env, settings)]
        train = [objective.task.task_id for objective in tasks_from_env_service(env, "calc", settings.env_service.train_split, 8)]
        val = [objective.task.task_id for objective in tasks_from_env_service(env, "calc", settings.env_service.val_split, -1)]
    assert seeds == train and len(seeds) == 8 and not set(seeds) & set(val)


def _own_expression_explorer(body: dict[str, Any]) -> str:
    """Plays the explorer as SmolLM2-135M did (docs/experiments.md): it computes the seed task's own
    solution, then answers. The seed is recognised by its question among the request's user messages."""
    from env_service.environments.calc.tasks import _all_tasks

    if EXPLORING not in body["messages"][0]["content"]:
        return "not an explorer request"
    if any(m["role"] == "tool" for m in body["messages"][-2:]):
        return "FINAL ANSWER: 1"
    queries = {task.query: task for task in _all_tasks().values() if task.split == "train"}
    seed = next(queries[m["content"]] for m in reversed(body["messages"])
                if m["role"] == "user" and m.get("content") in queries)
    return "<tool_call>\n" + json.dumps(seed.solution) + "\n</tool_call>"


@pytest.mark.parametrize(("config_name", "expect_tasks"), [("quickstart_hard", True), ("quickstart", False)])
def test_the_hard_presets_few_seeds_give_the_sq_arm_synthetic_tasks(
        calc: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path, config_name: str, expect_tasks: bool) -> None:
    """The sq arm's setting (8 seeds, writer=env) on each preset's training split, explored by a policy that
    only recomputes each seed's own solution: on the quickstart's single+chain seeds that is the question
    itself (a seed copy, nothing written: the old ablation's 0 synthetic tasks); on the hard levels' word
    problems the expression is not in the question, so calc renders it as a new proved task."""
    scripted_llm.respond_with(_own_expression_explorer)
    result = _cli(calc, scripted_llm, tmp_path, "task_manager.writer=env", "task_manager.num_seed_tasks=8",
                  "data.train_max_samples=8", "task_manager.max_explore_step=3", "task_manager.post_filters=[]",
                  options=("--config-name", config_name))
    assert result.returncode == 0, result.stderr + result.stdout
    written = read_objectives(tmp_path / "tasks.jsonl")
    summary = json.loads((tmp_path / "summary.json").read_text())
    counts, metrics = summary["counts"], summary["metrics"]
    assert metrics["tasks/written"] == len(written)
    # every explorer call the writer saw is a task written or a rejection with its reason
    assert metrics["tasks/rejected"] == sum(v for k, v in metrics.items() if k.startswith("tasks/rejected/"))
    assert counts["env_calls_seen"] == metrics["tasks/written"] + metrics["tasks/rejected"], (counts, metrics)
    if expect_tasks:
        assert len(written) >= 3, counts
        assert all(o.task.evaluator == "reference" for o in written)
        assert {o.seed_task_id.split("-")[1] for o in written} <= {"word", "distractor", "convert", "chain"}
    else:
        assert written == [] and counts["env_seed_copies"] >= 1, counts
