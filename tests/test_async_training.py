"""Async training (``trainer.mode=async``, issue 45 part 1): the producer thread's staleness bound and pause, the
start-up checks, and a 3-step run through ``python -m agentevolver.main_ppo`` with validation, a checkpoint, a
resume and Self-Attributing (ADCA-GRPO with a scripted judge).

The producer tests drive :class:`~agentevolver.verl.async_loop.RolloutAhead` with real threads; only the rollout
itself is a function that records which weights it ran on (the thing under test is the scheduling around it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import env_service
from scripted_openai_server import ScriptedOpenAIServer
from training_fixture import (
    GROUPS_OF_4,
    adca_judge,
    dumped_tasks,
    resume_from,
    run_training,
    training_command,
    training_timeout,
)

from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.async_loop import RolloutAhead, TaskBatch, check_async
from agentevolver.verl.step.state import StepState
from agentevolver.verl.tracking import read_metrics

# ------------------------------------------------------------------------------------------ the producer


def _batches(first: int, last: int) -> Iterator[TaskBatch]:
    for step in range(first, last + 1):
        yield TaskBatch(step=step, epoch=0, rows={"step": step}, loader_state={"after": step})


class Recorder:
    """The rollout: records when it ran; can fail at one step."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.spans: list[tuple[float, float]] = []
        self.lock = threading.Lock()

    def __call__(self, state: StepState) -> StepState:
        began = time.perf_counter()
        if state.step == self.fail_at:
            raise ValueError(f"rollout of step {state.step} failed")
        with self.lock:
            self.spans.append((began, time.perf_counter()))
        return state


def _wait_until(condition, what: str) -> None:
    """Poll ``condition`` (the producer is a thread); a generous hang limit, not a speed limit."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"the producer never got there: {what}"
        time.sleep(0.005)


def _train(bound: int, steps: int) -> tuple[list[int], Recorder, list]:
    """The trainer's side of the loop (``AgentEvolverTrainer._train_async``) with an update that lasts until the
    producer has rolled out every step it may (so the producer always runs as far ahead as the bound lets it)."""
    recorder = Recorder()
    ahead = RolloutAhead(_batches(1, steps), recorder,
                         lambda task: StepState(step=task.step, epoch=task.epoch, task_rows=task.rows),
                         version=0, bound=bound).start()
    staleness, pauses = [], []
    try:
        for expected in range(1, steps + 1):
            state, _ = ahead.next_step()
            assert state.step == expected and state.loader_state == {"after": expected}
            staleness.append(state.step - 1 - state.rollout_version)
            # the update: the servers hold version step - 1, so steps up to step + bound may roll out meanwhile
            ahead_of_us = list(range(expected + 1, min(expected + bound, steps) + 1))
            _wait_until(lambda after=expected, want=ahead_of_us: ahead.buffered_steps(after=after) == want,
                        f"steps {ahead_of_us} rolled out during step {expected}'s update")
            with ahead.paused():
                began = time.perf_counter()
                ahead.weights_synced(state.step)  # the weight sync and validation: no rollout may run now
                pauses.append((began, time.perf_counter()))
    finally:
        ahead.stop()
    return staleness, recorder, pauses


@pytest.mark.parametrize("bound", [1, 2])
def test_the_rollout_runs_ahead_up_to_the_bound_and_no_further(bound: int) -> None:
    staleness, recorder, pauses = _train(bound, steps=6)
    # step 1 on the weights it trains; then each step as stale as the bound allows, never more
    assert staleness == [min(step - 1, bound) for step in range(1, 7)]
    assert len(recorder.spans) == 6
    for began, ended in pauses:  # no rollout overlapped a weight sync
        assert not any(start < ended and began < end for start, end in recorder.spans)


def test_a_pause_waits_for_the_rollout_in_flight() -> None:
    release = threading.Event()

    def held(state: StepState) -> StepState:
        if state.step == 2:
            release.wait(timeout=120)
        return state

    ahead = RolloutAhead(_batches(1, 2), held, lambda task: StepState(step=task.step, epoch=0, task_rows=task.rows),
                         version=0, bound=1).start()
    ahead.next_step()
    _wait_until(lambda: ahead.buffered_steps(after=1) == [2], "step 2 in flight")
    paused = threading.Event()

    def pause() -> None:
        with ahead.paused():
            paused.set()

    pauser = threading.Thread(target=pause)
    pauser.start()
    assert not paused.wait(timeout=0.2)  # step 2's rollout still runs: no sync yet
    release.set()
    pauser.join(timeout=120)
    assert paused.is_set()
    assert ahead.next_step()[0].step == 2
    ahead.stop()


def test_a_failed_rollout_reaches_the_trainer_as_its_own_error() -> None:
    ahead = RolloutAhead(_batches(1, 3), Recorder(fail_at=2),
                         lambda task: StepState(step=task.step, epoch=0, task_rows=task.rows), version=0,
                         bound=1).start()
    state, _ = ahead.next_step()
    assert state.step == 1
    with ahead.paused():
        ahead.weights_synced(1)
    with pytest.raises(ValueError, match="rollout of step 2 failed"):
        ahead.next_step()
    ahead.stop()


# ------------------------------------------------------------------------------------------ start-up checks


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.mode=overlap"], r"trainer\.mode must be one of sync, async"),
    (["trainer.mode=async", "trainer.max_staleness=0"], r"trainer\.max_staleness must be an integer >= 1"),
    (["trainer.mode=async", "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.free_cache_engine=true"],
     r"free_cache_engine=false"),
])
def test_async_settings_that_cannot_run_stop_at_start(overrides: list[str], message: str) -> None:
    from agentevolver.config import compose_config

    with pytest.raises(ConfigError, match=message):
        check_async(compose_config(overrides))
    check_async(compose_config(["trainer.mode=async"]))  # the CPU preset's hf rollout overlaps as it is


# ------------------------------------------------------------------------------------------ training


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("async")) as running:
        yield running.url


def async_command(service: str, run_dir: Path, judge: ScriptedOpenAIServer, *extra: str) -> list[str]:
    """3 async steps with Self-Attributing on (ADCA-GRPO, ``judge`` answering every episode), so this run also
    proves that step labels work when a step's episodes were rolled out during the previous update."""
    return training_command(service, run_dir, "trainer.mode=async", "trainer.max_staleness=1", *GROUPS_OF_4,
                            "trainer.total_training_steps=3", "trainer.save_freq=2", "trainer.test_freq=2",
                            "data.val_max_samples=2", *adca_judge(judge.base_url), *extra)



@training_timeout
def test_an_async_run_keeps_its_staleness_bound_validates_and_resumes_without_skipping_tasks(
        service: str, tmp_path: Path, scripted_llm: ScriptedOpenAIServer) -> None:
    scripted_llm.respond_with(lambda body: "Step 1 Judgment: GOOD")
    first = tmp_path / "first"
    first.mkdir()
    done = run_training(async_command(service, first, scripted_llm), first)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-8000:]

    steps = read_metrics(first / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2, 3], sorted(steps)
    staleness = [steps[step]["async/staleness_max"] for step in (1, 2, 3)]
    assert staleness == [0.0, 1.0, 1.0], staleness  # step 1 on its own weights; then one update behind
    assert [steps[step]["async/off_policy_share"] for step in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert all(metrics["async/wait_rollout_s"] >= 0 for metrics in steps.values())
    assert any(metrics["actor/grad_norm"] > 0 for metrics in steps.values())  # a step whose groups tie has none
    assert any(key.startswith("val-core/") for key in steps[2]) and any(key.startswith("val-core/") for key in steps[3])
    records = list(read_rollout_dump(first / "run" / "rollouts" / "step_3.jsonl"))
    assert records and {record["staleness"] for record in records} == {1}
    assert "step(s) 3, rolled out ahead, are not in it" in output  # the checkpoint at step 2 says what it drops
    # Self-Attributing: every training episode judged once (validation episodes are not), labels in the dumps
    assert len(scripted_llm.requests) == 24  # 3 steps x 8 episodes
    for step, metrics in steps.items():
        assert metrics["adca/active"] == 1.0 and metrics["adca/labelled_samples"] == 8.0, step
        assert metrics["timing_s/judge"] >= metrics["adca/time_s"] > 0, step
    assert [r["step_flags"] for r in records] == [[True]] * 8  # lottery episodes have one step

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    done = run_training(async_command(service, resumed, scripted_llm, *resume_from(first, 2)), resumed)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    steps = read_metrics(resumed / "run" / "metrics.jsonl")
    assert sorted(steps) == [3], sorted(steps)
    assert steps[3]["async/staleness_max"] == 0.0  # rolled out on the resumed weights
    assert dumped_tasks(resumed, 3) == dumped_tasks(first, 3)  # the dropped step's tasks, played again
