"""End to end: ``python -m agentevolver.main_ppo --config-name quickstart`` trains on CPU.

The real entry point, the real environment service (serving ``lottery``, a one-step test environment whose
score varies between samples, so GRPO has something to learn from even with the random ``tiny-test``
model), verl's legacy trainer with the CPU backend, our agent loop, two GRPO steps. Checked: the losses
and gradients verl logs are finite and non-zero, the actor's weights moved, the rollout generated step 2
with the weights synced after step 1 (verl's rollout-vs-actor log-prob gap), checkpoints and rollout dumps
(with advantages) were written, and the episode metrics reached the logger.

Each training run here proves several things, because a run's fixed start-up (Ray, five actors, the model) costs
more than its two steps: the baseline run is also the reference of the crash-and-resume test, and one run with
Self-Attributing, a custom reward function and verl's own (unshared) forward in fp32 serves three tests. Its
tests stay separate, so a failure still names the capability; a run that fails fails all of its tests.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import REPO_ROOT, env_service
from scripted_openai_server import SCRIPTED_MODEL, ScriptedOpenAIServer, shared_scripted_llm_server
from test_custom_reward import REWARD_FILE
from training_fixture import (
    GROUPS_OF_4,
    adca_judge,
    dumped_tasks,
    kill_tree,
    load_safetensors,
    run_training,
    shared_prompt_check,
    training_command,
    training_env,
    training_timeout,
)

from agentevolver.backends.cpu.precision import resolve_dtype
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.module.task_manager import write_objectives
from agentevolver.schema import Task, TaskObjective
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout

#: Ray prefixes the lines an actor prints with "(ActorName pid=123) " (coloured on a terminal).
RAY_PREFIX = re.compile(r"^(\x1b\[[0-9;]*m)?\(\w+ pid=\d+[^)]*\)(\x1b\[[0-9;]*m)? ")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("main_ppo")) as running:
        yield running.url


def train(service: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_training(training_command(service, run_dir, *extra), run_dir)


#: Groups of 4: with 2 tasks x 2 samples over 2 steps, every group drew equal lottery scores about one run in 16
#: (seen in CI), and the update then had nothing to follow; with 4 per group that is ~1 in 4,096.


@pytest.fixture(scope="module")
def baseline(service: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """Two plain GRPO steps in groups of 4, a checkpoint (with the HF export) after each, the rollout server
    inside the training worker (``trainer.rollout_server=worker``): the run that
    :func:`test_two_grpo_steps_through_the_training_entry` checks, and the reference run of the crash test."""
    run_dir = tmp_path_factory.mktemp("baseline")
    return run_dir, train(service, run_dir, *GROUPS_OF_4, "trainer.rollout_server=worker")


def test_two_grpo_steps_through_the_training_entry(service: str, baseline: tuple[Path, subprocess.CompletedProcess[str]]
                                                   ) -> None:
    tmp_path, done = baseline
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]
    # the per-step table: a header, then one row per step ("1/2", "2/2")
    table_lines = [RAY_PREFIX.sub("", line).split() for line in done.stdout.splitlines()]
    assert any(line[:3] == ["step", "reward", "success"] for line in table_lines), done.stdout[-3000:]
    assert [line[0] for line in table_lines if line and line[0] in {"1/2", "2/2"}] == ["1/2", "2/2"]
    for metrics in steps.values():
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert metrics["episode/count"] == 8 and metrics["episode/ended/finished"] == 1.0
        assert 0.0 <= metrics["episode/success_rate"] <= 1.0
    # a step whose two groups both drew equal scores has zero advantages (sampling under load varies)
    assert any(metrics["actor/grad_norm"] > 0 for metrics in steps.values())
    # the quiet console: the table is shown, known noise only in the run's console.log
    assert "engine is not available" not in done.stdout + done.stderr
    assert "engine is not available" in (tmp_path / "run" / "console.log").read_text()
    # the TaskRunner ran in this process (trainer.task_runner=auto): no actor of that name printed a line
    console = (tmp_path / "run" / "console.log").read_text()
    assert "TaskRunner pid=" not in console
    # trainer.agent_loop_workers=auto: the episodes ran in this process (one worker, one node), so no agent-loop
    # worker process printed a line (prestarted, it prints as PrestartedAgentLoopWorker; verl's as AgentLoopWorker)
    assert "AgentLoopWorker pid=" not in console
    assert "prestart: the rollout server" not in console  # the server was not started again for other arguments
    assert "not taken over" not in console  # nothing prestarted was left over
    # trainer.rollout_server=worker: the hf server was built inside the training worker (verl bound the methods
    # that reach it), so no server actor's process printed a line
    assert "bind role actor_rollout method hf_server_call" in console
    assert "HFRolloutServer pid=" not in console
    # step 2 was generated by the rollout server holding the weights synced after step 1's update: the
    # trainer's recomputed log-probs agree with the rollout's, exactly in fp32 and to bf16 rounding under the
    # preset's auto dtype where it picks bf16 (tests/test_verl_cpu_backend.py checks fp32 exactly)
    gap_bound = 2e-2 if resolve_dtype("auto") == "bf16" else 1e-4
    assert steps[2]["rollout_corr/log_ppl_abs_diff"] < gap_bound, steps[2]["rollout_corr/log_ppl_abs_diff"]

    run = tmp_path / "run"
    original = load_safetensors(Path(resolve_model_path("tiny-test")))
    after = load_safetensors(run / "global_step_2" / "actor" / "huggingface")
    moved = max((after[name].float() - original[name].float()).abs().max().item() for name in original)
    assert moved > 1e-6

    advantages = []
    for step in (1, 2):
        records = list(read_rollout_dump(run / "rollouts" / f"step_{step}.jsonl"))
        assert len(records) == 8 and {r["step"] for r in records} == {step}
        assert len({r["group_id"] for r in records}) == 2
        for record in records:
            assert record["termination"] == "finished" and record["env_type"] == "lottery"
            assert len(record["advantages"]) == len(record["response_ids"]) == len(record["response_mask"])
            advantages += record["advantages"]
    assert any(a != 0.0 for a in advantages)  # a step whose groups tie has none (see the grad-norm check)

    # started again, the finished run says so before Ray starts, and trains no step past the end
    again = train(service, tmp_path, *GROUPS_OF_4)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "already trained to step 2 of trainer.total_training_steps=2" in again.stderr
    assert "Training Progress" not in again.stderr + again.stdout
    assert sorted(read_metrics(run / "metrics.jsonl")) == [1, 2]


def test_bad_config_is_reported_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "agentevolver.main_ppo", "agent_flow.max_steps=0",
                           "agent_flow.context_template=spiral"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "agent_flow.max_steps" in done.stderr and "agent_flow.context_template" in done.stderr


def test_sigkill_after_step_1_resumes_at_step_2_with_the_same_data(
        service: str, baseline: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    """Crash and resume: SIGKILL the whole training process tree after step 1's checkpoint, start again with
    ``trainer.resume_mode=auto``, and check it continues at step 2 with the tasks the baseline run (no crash,
    same data seed and batch size) trained at steps 1 and 2."""
    reference, done = baseline
    assert done.returncode == 0, "the baseline run failed: see test_two_grpo_steps_through_the_training_entry"
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    marker = crashed / "run" / "latest_checkpointed_iteration.txt"
    process = subprocess.Popen(training_command(service, crashed, *GROUPS_OF_4, "trainer.total_training_steps=3"),
                               cwd=crashed, env=training_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               text=True)
    try:
        while not (marker.exists() and marker.read_text().strip() == "1"):
            assert process.poll() is None, "training ended before its first checkpoint"
            time.sleep(0.5)
    finally:
        kill_tree(process)
    assert (crashed / "run" / "global_step_1").is_dir() and not (crashed / "run" / "global_step_2").exists()

    metrics_file = crashed / "run" / "metrics.jsonl"
    logged_before = metrics_file.read_text().splitlines() if metrics_file.exists() else []
    # resumed with verl's agent-loop worker actor (trainer.agent_loop_workers=actor): the one trainer.prestart
    # started beside the training worker ran the episodes, and nothing prestarted was left over
    resumed = train(service, crashed, *GROUPS_OF_4, "trainer.resume_mode=auto", "trainer.agent_loop_workers=actor")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-6000:]
    console = (crashed / "run" / "console.log").read_text()
    assert "(PrestartedAgentLoopWorker pid=" in console and "(AgentLoopWorker pid=" not in console
    assert "not taken over" not in console
    logged_after = metrics_file.read_text().splitlines()[len(logged_before):]
    assert [json.loads(line)["step"] for line in logged_after] == [2]  # appended to the same file: step 2 only
    assert (crashed / "run" / "global_step_2").is_dir()
    for step in (1, 2):
        assert dumped_tasks(crashed, step) == dumped_tasks(reference, step)


# ------------------------------------------------- one run: Self-Attributing, a custom reward, verl's own forward

@pytest.fixture(scope="module")
def attributed_run(service: str, tmp_path_factory: pytest.TempPathFactory
                   ) -> tuple[Path, subprocess.CompletedProcess[str], list[dict]]:
    """Two GRPO steps (groups of 4, fp32, KL loss so the reference pass runs, ``--verbose``, the TaskRunner and
    the agent-loop worker as verl's Ray actors: ``trainer.task_runner=actor``, ``trainer.agent_loop_workers=actor``,
    and its processes started in verl's order: ``trainer.prestart=false``; every other run has these as shipped)
    with three things
    on that do not touch each other: ADCA-GRPO with a scripted judge answering GOOD for step 1 (it changes
    advantages only), a custom reward function (it changes the scores), and the shared-prompt forward off
    (verl's own forward: the only end-to-end run of that path on CPU, whose preset turns sharing on).
    Returns the run folder, the finished process and the judge's request bodies."""
    run_dir = tmp_path_factory.mktemp("attributed")
    reward_file = run_dir / "my_reward.py"
    reward_file.write_text(REWARD_FILE)
    judge = shared_scripted_llm_server()
    judge.reset()
    judge.respond_with(lambda body: "Step 1 Judgment: GOOD")
    try:
        done = train(service, run_dir, *adca_judge(judge.base_url),
                     f"reward.custom_reward_function.path={reward_file}",
                     "reward.custom_reward_function.name=compute_score",  # 0.25 + 0.5 x env score, logged
                     f"+reward.custom_reward_function.reward_kwargs.log_path={run_dir / 'calls.jsonl'}",
                     *shared_prompt_check(shared=False), "trainer.task_runner=actor", "trainer.prestart=false",
                     "trainer.agent_loop_workers=actor", "--verbose")
        requests = judge.bodies
    finally:
        judge.reset()
    return run_dir, done, requests


def _finished(run: tuple[Path, subprocess.CompletedProcess[str], list[dict]]) -> dict[int, dict[str, float]]:
    run_dir, done, _ = run
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    steps = read_metrics(run_dir / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]
    return steps


def test_adca_labels_steps_through_the_training_entry(attributed_run) -> None:
    """Self-Attributing on through its one switch (the estimator): every training episode is judged once per
    step, the labels reach the dumps and the ADCA metrics reach metrics.jsonl; the judge has a timer of its
    own, outside the update's. (Async training with ADCA: tests/test_async_training.py.)"""
    steps = _finished(attributed_run)
    run_dir, done, requests = attributed_run
    assert "engine is not available" in done.stderr  # --verbose: every line on the console
    assert "(TaskRunner pid=" in done.stdout + done.stderr  # trainer.task_runner=actor: verl's TaskRunner actor
    assert "(AgentLoopWorker pid=" in done.stdout + done.stderr  # trainer.prestart=false: verl's own, in its order
    assert "(HFRolloutServer pid=" in done.stdout + done.stderr  # trainer.rollout_server=actor (the default)
    assert len(requests) == 16  # 2 steps x 8 episodes, one request per episode
    for metrics in steps.values():
        assert metrics["adca/active"] == 1.0 and metrics["adca/labelled_samples"] == 8.0
        assert metrics["timing_s/judge"] >= metrics["adca/time_s"] > 0
        assert metrics.get("async/staleness_max") is None  # sync: no step was rolled out ahead
    for step in (1, 2):
        records = list(read_rollout_dump(run_dir / "run" / "rollouts" / f"step_{step}.jsonl"))
        assert [r["step_flags"] for r in records] == [[True]] * 8  # lottery episodes have one step


def test_custom_reward_scores_a_training_run(attributed_run) -> None:
    """verl's ``reward.custom_reward_function`` scores agent episodes: the rollout dumps, the trained reward
    (``critic/score/mean``) and the function's own log agree (unit tests: tests/test_custom_reward.py)."""
    steps = _finished(attributed_run)
    run_dir, _, _ = attributed_run
    calls = [json.loads(line) for line in (run_dir / "calls.jsonl").read_text().splitlines()]
    assert len(calls) == 16  # 2 steps x 2 tasks x 4 episodes, no validation
    assert {call["data_source"] for call in calls} == {"lottery"}
    for step in (1, 2):
        records = list(read_rollout_dump(run_dir / "run" / "rollouts" / f"step_{step}.jsonl"))
        assert len(records) == 8
        outcomes = []
        for record in records:
            env_score = record["metrics"]["reward/before_custom"]
            assert record["reward"]["outcome"] == 0.25 + 0.5 * env_score
            assert record["reward"]["success_rate"] == env_score  # lottery: success = its 0/1 score
            outcomes.append(record["reward"]["outcome"])
        # the trained reward is the function's score
        assert math.isclose(steps[step]["critic/score/mean"], sum(outcomes) / len(outcomes), abs_tol=1e-6)


def test_verls_own_forward_recomputes_the_rollouts_log_probs(attributed_run) -> None:
    """With the shared-prompt switch off (tests/test_shared_prefix.py runs it on), every token goes through
    verl's own forward, and what the update is built on still holds: the old log-probs the trainer
    recomputes equal the rollout server's own (fp32 both; verl's ``rollout_corr/log_ppl_diff_max``), and the
    run trains."""
    steps = _finished(attributed_run)
    for metrics in steps.values():
        ratio = [value for key, value in metrics.items() if key.endswith("shared_prompt_token_ratio")]
        assert ratio == [1.0], sorted(metrics)
        assert abs(metrics["rollout_corr/log_ppl_diff_max"]) <= 1e-4, metrics["rollout_corr/log_ppl_diff_max"]
        assert math.isfinite(metrics["actor/pg_loss"])
    # a step whose two groups each drew four equal scores has no outcome advantage, and step 1's KL to the
    # reference is 0; ADCA's GOOD labels still move the advantages, so one step must train
    assert any(metrics["actor/grad_norm"] > 0 for metrics in steps.values()), [m["actor/grad_norm"] for m in steps.values()]


def test_synthetic_tasks_are_graded_by_their_own_grader(service: str, tmp_path: Path,
                                                        scripted_llm: ScriptedOpenAIServer) -> None:
    """The training mixture takes synthetic tasks from task_manager.synthetic_tasks_path, and each task's
    episodes are scored by its own grader: an ``llm`` task's by the task_grader role (a scripted judge here), a
    ``reference`` task's (a proved answer) by code with no LLM request, the originals by the environment."""
    synthetic = [
        TaskObjective(task=Task(task_id="t0~syn-0", env_type="lottery", query="Win round 0", evaluator="llm"),
                      seed_task_id="t0"),
        TaskObjective(task=Task(task_id="t1~syn-1", env_type="lottery", query="What is 1 + 1?", ground_truth="2",
                                evaluator="reference", metadata={"proof": {"call": "calculator(1 + 1)"}}),
                      source="synthetic", seed_task_id="t1"),
    ]
    tasks_file = write_objectives(tmp_path / "synthetic.jsonl", synthetic)
    scripted_llm.respond_with(lambda body: '{"relevance": 1, "success": 1, "efficiency": 0.5, "reason": "ok"}')
    done = train(service, tmp_path, f"task_manager.synthetic_tasks_path={tasks_file}",
                 "task_manager.mixture.synthetic_data_ratio=1.0", "data.train_max_samples=2",
                 f"llm.endpoints.local.base_url={scripted_llm.base_url}",
                 f"llm.endpoints.local.model={SCRIPTED_MODEL}", "trainer.save_freq=-1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    records = [r for step in (1, 2) for r in read_rollout_dump(tmp_path / "run" / "rollouts" / f"step_{step}.jsonl")]

    def query(record: dict) -> str:
        return next(m["content"] for m in record["messages"] if m["role"] == "user")

    by_llm = [r for r in records if r["reward"]["description"].startswith("llm grader")]
    by_code = [r for r in records if r["reward"]["description"].startswith("reference grader")]
    assert len(records) == 8 and len(by_llm) == 2 and len(by_code) == 2  # 2 synthetic + 2 original tasks, 2 each
    assert {r["reward"]["outcome"] for r in by_llm} == {0.75}  # 1 x 1 x (0.5 + 0.5 x 0.5)
    assert [query(r) for r in by_llm] == ["Win round 0"] * 2  # the synthetic query replaced the seed's
    assert [query(r) for r in by_code] == ["What is 1 + 1?"] * 2
    assert all(r["reward"]["outcome"] in (0.0, 1.0) for r in by_code)
    # one grading request per llm-graded episode: none for the reference task's or the originals'
    assert len(scripted_llm.requests) == 2
    assert all(r["reward"]["description"].startswith("environment score")
               for r in records if r not in by_llm and r not in by_code)
    # the mixture's size is logged once, with the first step (no generation ran: no funnel)
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert {k: v for k, v in steps[1].items() if k.startswith("tasks/")} == {"tasks/train": 4.0,
                                                                             "tasks/train_synthetic": 2.0}
    assert not any(k.startswith("tasks/") for k in steps[2])
