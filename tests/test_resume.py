"""Crash and resume: SIGKILL the whole training process tree after step 1's checkpoint, start again with
``trainer.resume_mode=auto``, and check it continues at step 2 with the data a run without the crash had."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import env_service
from training_fixture import kill_tree, run_training, training_command, training_env, training_timeout

from agentevolver.module.agent_flow import read_rollout_dump

pytestmark = training_timeout


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("resume")) as running:
        yield running.url


def tasks_of(run: Path, step: int) -> Counter[str]:
    return Counter(r["task_id"] for r in read_rollout_dump(run / "rollouts" / f"step_{step}.jsonl"))


def run_to_end(service: str, run_dir: Path, *extra: str) -> None:
    done = run_training(training_command(service, run_dir, *extra), run_dir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def test_sigkill_after_step_1_resumes_at_step_2_with_the_same_data(service: str, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    run_to_end(service, reference)

    crashed = tmp_path / "crashed"
    crashed.mkdir()
    marker = crashed / "run" / "latest_checkpointed_iteration.txt"
    process = subprocess.Popen(training_command(service, crashed, "trainer.total_training_steps=3"), cwd=crashed,
                               env=training_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        while not (marker.exists() and marker.read_text().strip() == "1"):
            assert process.poll() is None, "training ended before its first checkpoint"
            time.sleep(0.5)
    finally:
        kill_tree(process)
    assert (crashed / "run" / "global_step_1").is_dir() and not (crashed / "run" / "global_step_2").exists()

    metrics_file = crashed / "run" / "metrics.jsonl"
    logged_before = metrics_file.read_text().splitlines() if metrics_file.exists() else []
    run_to_end(service, crashed, "trainer.resume_mode=auto")
    logged_after = metrics_file.read_text().splitlines()[len(logged_before):]
    steps = [json.loads(line)["step"] for line in logged_after]
    assert steps == [2]  # the resumed run (appending to the same metrics file) logged step 2 only
    assert (crashed / "run" / "global_step_2").is_dir()
    for step in (1, 2):
        assert tasks_of(crashed / "run", step) == tasks_of(reference / "run", step)
