"""Task generation end to end: the real environment service (codebox), a scripted OpenAI-compatible server
playing the explorer, summariser and feasibility judge (it records what it was sent), the real command
line, a kill in the middle of a run and the resume, and the trainer's datasets built from the mixture.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import REPO_ROOT, env_service
from scripted_openai_server import Reply, ScriptedOpenAIServer

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClients
from agentevolver.config import compose_config, load_config, validate_config
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeSpec
from agentevolver.module.task_manager import TaskManager, read_objectives, seed_tasks
from agentevolver.module.task_manager.masking import MASK, query_fragments
from agentevolver.module.task_manager.prompts import FILTER_SYSTEM, SUMMARIZER_SYSTEM
from agentevolver.verl.task_dataset import build_task_datasets
from env_service.environments.codebox.tasks import get_task


@pytest.fixture(scope="module")
def codebox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("codebox", tmp_path=tmp_path_factory.mktemp("codebox")) as running:
        yield running.url


def _role(body: dict[str, Any]) -> str:
    system = body["messages"][0]["content"]
    if system.startswith(SUMMARIZER_SYSTEM):
        return "summarizer"
    if system.startswith(FILTER_SYSTEM):
        return "filter"
    return "explorer" if "EXPLORING" in system else "other"


class Roles:
    """The scripted LLM roles. The explorer echoes the task it was shown (the leak masking must stop) and
    runs a program; each summary writes one new task, one that repeats across a seed's explorations and
    a near-duplicate of it; the judge rejects one task and cannot be parsed on another."""

    def __init__(self, *, bad_first_summary: bool = True, hang_summary: int | None = None) -> None:
        self.calls: Counter[str] = Counter()
        self.bad_first_summary = bad_first_summary
        self.hang_summary = hang_summary

    def __call__(self, body: dict[str, Any]) -> Reply | str:
        role = _role(body)
        self.calls[role] += 1
        if role == "explorer":
            task = body["messages"][1]["content"]
            return f"Let me look around. The task was:\n{task}\n\n```python\nprint(sum(range(10)))\n```"
        if role == "summarizer":
            number = self.calls[role]
            if number == self.hang_summary:
                return Reply.hang(900)
            if self.bad_first_summary:
                if number == 1:
                    return "I explored the sandbox and ran a sum."
                number -= 1
            return json.dumps([
                {"query": f"Write a function that returns {number} plus the sum of a list.", "answer": "n + sum",
                 "confidence": 0.7},
                {"query": "Write a function that doubles a number.", "answer": "2 * x"},
                {"query": "Write a function that doubles the number.", "answer": "2 * x"},
            ])
        if role == "filter":  # the last message stating a task (a retry adds the parse error after it)
            task = next(m["content"] for m in reversed(body["messages"]) if "Task:" in m["content"])
            if "returns 2 plus" in task:
                return '{"feasible": false, "reason": "not possible"}'
            if "returns 4 plus" in task:
                return "maybe?"
            return '{"feasible": true, "reason": "the sandbox runs Python"}'
        return Reply.error(418, f"unexpected role in {body['messages'][0]['content'][:80]!r}")


def _overrides(service: str, scripted: ScriptedOpenAIServer, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "env_service.env_type=codebox", f"env_service.env_url={service}", "env_service.max_retries=0",
        f"llm.endpoints.local.base_url={scripted.base_url}", "llm.endpoints.local.max_retries=0",
        "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
        "llm.endpoints.local.max_tokens=64",
        f"task_manager.synthetic_tasks_path={tmp_path / 'tasks.jsonl'}",
        f"task_manager.checkpoint_path={tmp_path / 'checkpoint.json'}",
        "task_manager.n=2", "task_manager.num_seed_tasks=3", "task_manager.max_explore_step=2",
        "task_manager.num_explore_threads=1", "task_manager.parse_retries=1", *extra,
    ]


def _generate(service: str, scripted: ScriptedOpenAIServer, tmp_path: Path, *extra: str):
    _cfg, settings = load_config(_overrides(service, scripted, tmp_path, *extra))
    with EnvClient.from_config(settings.env_service) as env, LLMClients(settings.llm) as llm:
        manager = TaskManager.from_settings(settings, env=env, llm=llm)
        seeds = seed_tasks(env, settings)
        return manager.generate_task(seeds), seeds, env.stats["requests"]


def _contents(role: str, scripted: ScriptedOpenAIServer) -> list[str]:
    return [m["content"] for b in scripted.bodies if _role(b) == role for m in b["messages"]]


def test_generation_masks_the_query_retries_bad_json_and_drops_duplicates(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = Roles()
    scripted_llm.respond_with(roles)
    report, seeds, _ = _generate(codebox, scripted_llm, tmp_path)

    # the explorer saw each seed's task; the summariser and the judge never did, in any form
    statements = [get_task(seed.task_id).statement() for seed in seeds]
    explorer_text = "\n".join(_contents("explorer", scripted_llm))
    assert all(statement in explorer_text for statement in statements)
    summarizer_text = _contents("summarizer", scripted_llm)
    for statement in statements:
        for fragment in query_fragments(statement):
            assert not any(fragment in content for content in summarizer_text + _contents("filter", scripted_llm))
    assert sum(MASK in content for content in summarizer_text) >= 6  # stated once + echoed, per exploration

    c = report.counts
    assert (c["explorations_planned"], c["explorations_run"], c["explorations_resumed"]) == (6, 6, 0)
    assert c["explore_steps"] == 12 and roles.calls["explorer"] == 12
    # the first summary was not JSON: retried with its error, counted, and the retry parsed
    assert (c["summary_replies"], c["summary_unparsed_replies"], c["summaries_failed"]) == (7, 1, 0)
    first_summary = next(b for b in scripted_llm.bodies if _role(b) == "summarizer")["messages"]
    assert [m["role"] for m in first_summary] == ["system", "user", "assistant", "user"]  # worked example first
    retry = next(b for b in scripted_llm.bodies if _role(b) == "summarizer" and len(b["messages"]) == 6)
    assert "could not be used" in retry["messages"][5]["content"]
    # per seed: the repeated task is dropped in its second exploration, the near-duplicate always
    assert c["objectives_proposed"] == 18
    assert (c["dropped_exact_duplicate"], c["dropped_near_duplicate"]) == (3, 6)
    # the judge: one infeasible, one unparseable twice (dropped, counted)
    assert (c["judged"], c["judged_kept"], c["judged_unparsed"]) == (9, 7, 1)
    rates = report.rates()
    assert rates["parse_rate"] == pytest.approx(6 / 7) and rates["duplicate_rate"] == pytest.approx(9 / 18)
    assert rates["feasibility_rate"] == pytest.approx(7 / 9)
    # the same funnel as tasks/* metrics (the trainer logs them, the ablation report reads them)
    assert report.metrics() == {
        "tasks/explorations": 6.0, "tasks/explorations_failed": 0.0,
        "tasks/explorations_without_tool_calls": 6.0,  # the scripted explorer runs code from a fence, not a tool call
        "tasks/proposed": 18.0, "tasks/written": 7.0,
        "tasks/distinct": 5.0, "tasks/eval_overlap": 0.0,  # dedup is per seed: 2 of the 7 repeat another seed's task
        "tasks/rejected": 11.0 + c["summary_rejected_items"], "tasks/rejected/exact_duplicate": 3.0,
        "tasks/rejected/near_duplicate": 6.0, "tasks/rejected/post_filter": 2.0,
        **({"tasks/rejected/malformed": float(c["summary_rejected_items"])} if c["summary_rejected_items"] else {})}

    written = read_objectives(tmp_path / "tasks.jsonl")
    assert written == report.objectives and len(written) == c["tasks_written"] == 7
    # every exploration in the explorations log beside the checkpoint: what the explorer said, what it kept
    logged = [json.loads(line) for line in (tmp_path / "checkpoint.explorations.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in logged) == sorted(f"{s.task_id}#{r}" for s in seeds for r in range(2))
    for entry in logged:
        replies = [m["content"] for m in entry["trajectory"]["messages"] if m["role"] == "assistant"]
        assert len(replies) == 2 and all("print(sum(range(10)))" in reply for reply in replies)
        assert entry["counts"]["explore_tool_calls"] == 0 and entry["counts"]["explore_without_tool_calls"] == 1
        assert entry["trajectory"]["metadata"]["tools_offered"] > 0
    assert sum(len(e["tasks"]) for e in logged) == sum(e["counts"]["objectives_kept"] for e in logged) == 9
    assert not any("returns 2 plus" in o.task.query or "returns 4 plus" in o.task.query for o in written)
    for seed in seeds:
        mine = [o.task.query for o in written if o.seed_task_id == seed.task_id]
        assert mine.count("Write a function that doubles a number.") == 1
    assert all(o.task.evaluator == "llm" and o.source == "synthetic" and o.task.env_type == "codebox"
               for o in written)


def test_n_zero_sends_no_llm_request(codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(Roles())
    report, _seeds, env_requests = _generate(codebox, scripted_llm, tmp_path, "task_manager.n=0")
    assert report.objectives == [] and not report.counts and not scripted_llm.requests
    assert env_requests == 1  # only listing the seed tasks; nothing explored
    assert not (tmp_path / "checkpoint.json").exists() and not (tmp_path / "tasks.jsonl").exists()
    cfg = compose_config(_overrides(codebox, scripted_llm, tmp_path, "task_manager.n=0", "data.val_max_samples=2"))
    train, val = build_task_datasets(cfg, validate_config(cfg))
    assert not scripted_llm.requests
    assert len(train) == len(get_task.__globals__["task_ids"]("train")) and len(val) == 2
    assert all(o.source == "original" and o.task.query is None for o in train.objectives + val.objectives)
    result = subprocess.run([sys.executable, "-m", "agentevolver.module.task_manager", "--no-progress",
                             *_overrides(codebox, scripted_llm, tmp_path, "task_manager.n=0")],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "task_manager.n is 0" in result.stderr and not scripted_llm.requests


def test_a_validation_only_run_trains_on_its_validation_tasks_and_generates_nothing(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    """An ablation's untrained base: no human task and no synthetic file (a training run stops for want of one),
    but ``trainer.val_only`` needs no training task: verl's loader gets the validation tasks."""
    scripted_llm.respond_with(Roles())
    empty = ("task_manager.n=0", "task_manager.mixture.use_original_tasks=false",
             "task_manager.mixture.synthetic_data_ratio=1", "data.val_max_samples=3")
    with pytest.raises(ConfigError, match=r"synthetic_tasks_path: .* does not exist"):
        build_task_datasets(*load_config(_overrides(codebox, scripted_llm, tmp_path, *empty)))
    train, val = build_task_datasets(*load_config(_overrides(codebox, scripted_llm, tmp_path, *empty,
                                                             "trainer.val_only=true")))
    assert not scripted_llm.requests and not (tmp_path / "tasks.jsonl").exists()  # nothing explored or read
    assert len(val) == 3 and train.objectives == val.objectives


def test_trainer_datasets_mix_synthetic_tasks_into_training_only(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    scripted_llm.respond_with(Roles(bad_first_summary=False))
    overrides = _overrides(codebox, scripted_llm, tmp_path, "task_manager.n=1", "task_manager.num_seed_tasks=2",
                           "task_manager.max_explore_step=1", "task_manager.mixture.synthetic_data_ratio=0.5",
                           "data.train_max_samples=6", "data.val_max_samples=3")
    train, val = build_task_datasets(*load_config(overrides))
    requests = len(scripted_llm.requests)
    assert requests > 0
    synthetic = [o for o in train.objectives if o.source == "synthetic"]
    assert len(train) == 6 + 3 and len(synthetic) == 3 and len(val) == 3
    settings = load_config(overrides)[1]
    with EnvClient.from_config(settings.env_service) as env:
        seeds = {seed.task_id for seed in seed_tasks(env, settings)}
    for objective in synthetic:
        spec = EpisodeSpec.for_objective(objective, group_id="g")
        assert spec.task_id in seeds and spec.query and spec.task.evaluator == "llm"
        assert spec.task.task_id.startswith(spec.task_id + "~syn-")
    assert all(o.source == "original" for o in val.objectives)  # validation: original only
    assert train[0]["task"] is train.objectives[0]
    # a second start resumes the finished generation: no LLM request, the same datasets
    train2, val2 = build_task_datasets(*load_config(overrides))
    assert len(scripted_llm.requests) == requests
    assert train2.objectives == train.objectives and val2.objectives == val.objectives


def test_resume_skips_finished_work_and_changed_inputs_start_afresh(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = Roles(bad_first_summary=False)
    scripted_llm.respond_with(roles)
    small = ("task_manager.n=1", "task_manager.num_seed_tasks=1", "task_manager.max_explore_step=1")
    first, _, _ = _generate(codebox, scripted_llm, tmp_path, *small)
    assert first.checkpoint_status == "fresh" and roles.calls["explorer"] == 1
    calls = sum(roles.calls.values())
    again, _, _ = _generate(codebox, scripted_llm, tmp_path, *small)
    assert again.checkpoint_status == "resumed" and again.counts["explorations_resumed"] == 1
    assert sum(roles.calls.values()) == calls and again.objectives == first.objectives  # nothing redone
    more, _, _ = _generate(codebox, scripted_llm, tmp_path, "task_manager.n=2", *small[1:])
    assert (more.counts["explorations_resumed"], more.counts["explorations_run"]) == (1, 1)  # n is not an input
    changed, _, _ = _generate(codebox, scripted_llm, tmp_path, *small[:2], "task_manager.max_explore_step=2")
    assert changed.checkpoint_status == "inputs changed" and changed.counts["explorations_run"] == 1
    assert roles.calls["explorer"] == 1 + 1 + 2
    # the explorations log holds each exploration run, once: resumed ones are not logged again
    log = tmp_path / "checkpoint.explorations.jsonl"
    assert [json.loads(line)["round"] for line in log.read_text().splitlines()] == [0, 1, 0]
    log.unlink()
    _generate(codebox, scripted_llm, tmp_path, *small[:2], "task_manager.max_explore_step=3",
              "task_manager.save_explorations=false")
    assert not log.exists()


def test_explorations_of_different_seeds_run_concurrently(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = Roles(bad_first_summary=False)

    def hold_first_explorer_turns(body: dict[str, Any]) -> Reply | str:
        reply = roles(body)
        if _role(body) == "explorer" and len(body["messages"]) == 2 and isinstance(reply, str):
            return Reply.answer(reply, hold_until_in_flight=3)
        return reply

    scripted_llm.respond_with(hold_first_explorer_turns)
    report, _, _ = _generate(codebox, scripted_llm, tmp_path, "task_manager.n=1", "task_manager.max_explore_step=1",
                             "task_manager.num_explore_threads=8", "task_manager.post_filters=[]")
    assert scripted_llm.max_in_flight == 3 and report.counts["explorations_run"] == 3
    assert report.counts["judged"] == 0 and len(report.objectives) == 6


def _cli(service: str, scripted: ScriptedOpenAIServer, tmp_path: Path, summary: Path) -> subprocess.Popen[str]:
    args = ["--no-progress", "--summary-json", str(summary), *_overrides(
        service, scripted, tmp_path, "llm.endpoints.local.timeout_s=900")]
    return subprocess.Popen([sys.executable, "-m", "agentevolver.module.task_manager", *args], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_killed_mid_run_resumes_without_redoing_finished_explorations(
        codebox: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    first = Roles(bad_first_summary=False, hang_summary=4)
    scripted_llm.respond_with(first)
    checkpoint = tmp_path / "checkpoint.json"
    process = _cli(codebox, scripted_llm, tmp_path, tmp_path / "first.json")
    deadline = time.monotonic() + 600  # how long we wait for the run to get there, not a test time limit
    try:
        while True:
            done = json.loads(checkpoint.read_text())["explorations"] if checkpoint.exists() else []
            if len(done) == 3 and first.calls["summarizer"] == 4:
                break  # three explorations recorded; the fourth is in its (hanging) summary
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the first run never recorded three explorations"
            time.sleep(0.2)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate()
    assert process.returncode == -signal.SIGKILL and not (tmp_path / "tasks.jsonl").exists()
    finished = {r["key"] for r in json.loads(checkpoint.read_text())["explorations"]}

    scripted_llm.reset()
    roles = Roles(bad_first_summary=False)
    scripted_llm.respond_with(roles)
    process = _cli(codebox, scripted_llm, tmp_path, tmp_path / "second.json")
    stdout, stderr = process.communicate()
    assert process.returncode == 0, stderr
    summary = json.loads((tmp_path / "second.json").read_text())
    assert summary["checkpoint"] == "resumed"
    assert (summary["counts"]["explorations_resumed"], summary["counts"]["explorations_run"]) == (3, 3)
    assert roles.calls["explorer"] == 3 * 2 and roles.calls["summarizer"] == 3  # only the unfinished ones
    assert len(json.loads(checkpoint.read_text())["explorations"]) == 6
    written = read_objectives(tmp_path / "tasks.jsonl")
    assert len(written) == summary["counts"]["tasks_written"] > 0
    assert {o.seed_task_id for o in written} == {key.split("#")[0] for key in finished}
    assert "task generation" in stdout and "parse rate" in stdout and "duplicate rate" in stdout
