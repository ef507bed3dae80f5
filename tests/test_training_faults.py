"""Faults that must not stop training, through the real entry points (``main_ppo``, the launcher).

- Episodes whose environment fails are counted (``episode/failed*``) and kept out of the update: no loss on
  their tokens, no say in their group's baseline; a judge that times out leaves its samples with GRPO's
  advantage (counted in ``adca/judge/errors``); the run trains to its last step.
- The env service dying mid-rollout is started again by the launcher, the episodes it took down run again,
  and the run reaches its last step; a full disk under the rollout dump loses the dump, not the run.
- Too many failed episodes in a step stop the run with one message naming the service.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from env_service_fixture import REPO_ROOT, TESTS_DIR, env_service
from envs_for_tests import OUTAGE_AFTER_ENV, OUTAGE_MARKER_ENV
from ports import free_port
from scripted_openai_server import SCRIPTED_MODEL, Reply
from training_fixture import kill_tree, run_training, training_command, training_timeout

from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery_flaky,lottery_broken", tmp_path=tmp_path_factory.mktemp("faults")) as running:
        yield running.url


def grpo_expected(records: list[dict]) -> dict[int, float]:
    """Per record index: verl's GRPO advantage over the *good* episodes of its group only."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    good = [i for i, r in enumerate(records) if not r["failure"]]
    scores = torch.tensor([[records[i]["reward"]["outcome"]] for i in good], dtype=torch.float32)
    index = [records[i]["group_id"] for i in good]
    advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), index)
    return {i: float(advantages[k, 0]) for k, i in enumerate(good)}


def test_failed_episodes_stay_out_of_the_update_and_a_hung_judge_falls_back_to_grpo(
        service: str, tmp_path: Path, scripted_llm) -> None:
    scripted_llm.respond_with(lambda body: Reply.hang(20))  # every judge request outlives its 0.5 s timeout
    # bypass mode (the quickstart's: old log-probs = rollout log-probs), where the outage used to end the run
    command = training_command(service, tmp_path, "env_service.env_type=lottery_flaky", "agent_flow.episode_retries=0",
                               "env_service.max_retries=0", "algorithm.rollout_correction.bypass_mode=true",
                               "attribution_driven_credit_assignment.enable=true",
                               f"llm.endpoints.local.base_url={scripted_llm.base_url}",
                               f"llm.endpoints.local.model={SCRIPTED_MODEL}", "llm.endpoints.local.timeout_s=0.5",
                               "llm.endpoints.local.max_retries=0", "trainer.save_freq=-1")
    done = run_training(command, tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    # the old switch of ADCA still works, with a one-line notice naming the new one
    assert "it is algorithm.adv_estimator=adca_grpo now" in done.stderr
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]  # trained to the last step
    for step, metrics in steps.items():
        # lottery_flaky fails every third instance: one of each step's four episodes
        assert metrics["episode/count"] == 4 and metrics["episode/failed"] == 1, (step, metrics)
        assert metrics["episode/failed/env"] == 1 and metrics["episode/failed_share"] == 0.25
        assert metrics["adca/active"] == 1.0 and metrics["adca/judge/errors"] >= 1  # counted, not fatal
        assert "timing_s/faults" in metrics
        records = list(read_rollout_dump(tmp_path / "run" / "rollouts" / f"step_{step}.jsonl"))
        failed = [r for r in records if r["failure"]]
        assert len(failed) == 1 and failed[0]["failure"] == "env" and failed[0]["termination"] == "env_error"
        assert all(a == 0.0 for a in failed[0]["advantages"])  # no loss on its tokens
        expected = grpo_expected(records)
        for index, value in expected.items():  # the others: GRPO over their group without the failed one
            record = records[index]
            trained = [a for a, m in zip(record["advantages"], record["response_mask"], strict=True) if m]
            assert trained and all(abs(a - value) < 1e-5 for a in trained), (record["group_id"], trained, value)


@pytest.mark.slow  # the rule itself is pinned in tests/test_faults.py; this is its message through main_ppo
def test_a_step_where_every_episode_fails_stops_the_run_naming_the_service(service: str, tmp_path: Path) -> None:
    done = run_training(training_command(service, tmp_path, "env_service.env_type=lottery_broken",
                                         "agent_flow.episode_retries=0", "env_service.max_retries=0"), tmp_path)
    assert done.returncode == 2, (done.stdout + done.stderr)[-6000:]
    message = done.stderr[done.stderr.index("error: "):]
    assert "training step 1: every episode failed" in message, message
    assert "4 x env: check the environment service" in message and "agent_flow.max_failed_share" in message
    assert "The most common error (4 of the 4 failed episodes): env: " in message
    assert "cannot create instances" in message  # the environment's own words, quoted
    dump = tmp_path / "run" / "rollouts" / "step_1.jsonl"
    assert f"rollout dump, {dump}" in message
    records = list(read_rollout_dump(dump))  # written before the stop
    assert len(records) == 4 and all(r["failure"] == "env" and r["error"] for r in records)
    assert "Traceback" not in message
    assert not (tmp_path / "run" / "global_step_1").exists()  # nothing was trained on it


# -- the launcher: an env-service outage mid-rollout ---------------------------------------------------------

@contextlib.contextmanager
def full_tmpfs(path: Path) -> Iterator[bool]:
    """A 64 KiB tmpfs at ``path``, filled up (writes there fail with ENOSPC); yields False where mounting is
    not permitted (no root), so the caller knows the disk-full part did not run."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                             capture_output=True, check=False).returncode == 0
    try:
        if mounted:
            with contextlib.suppress(OSError), open(path / "filler", "wb") as filler:
                filler.write(b"\0" * (1 << 20))
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def test_an_env_service_outage_mid_rollout_is_survived(tmp_path: Path) -> None:
    env_port = free_port()
    marker = tmp_path / "kill-env-now"
    overrides = training_command(f"http://127.0.0.1:{env_port}", tmp_path)[5:]
    with full_tmpfs(tmp_path / "full-disk") as disk_full:
        args = [sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(REPO_ROOT / "examples" / "quickstart.yaml"),
                "--with-env", "lottery_outage", "--", *overrides, "env_service.env_type=lottery_outage",
                "trainer.experiment_name=outage", "trainer.save_freq=-1",
                "launcher.services.env.extra_args=[--plugin,envs_for_tests,--log-level,warning]",
                "launcher.poll_interval_s=0.2", "launcher.restart_backoff_s=0.5",
                "agent_flow.episode_retry_backoff_s=3", "agent_flow.episode_retries=3",
                "algorithm.rollout_correction.bypass_mode=true"]  # the quickstart's mode, as in the outage it had
        if disk_full:
            args.append(f"agent_flow.dump.dir={tmp_path / 'full-disk' / 'rollouts'}")
        # step 1's 4 one-step episodes are answered; the first step of step 2's rollout kills the service
        marker.write_text("armed")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT)]),
               OUTAGE_MARKER_ENV: str(marker), OUTAGE_AFTER_ENV: "4"}
        launcher = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            stdout, stderr = launcher.communicate()
        except BaseException:
            kill_tree(launcher)
            raise
    output = stdout + stderr
    assert launcher.returncode == 0, output[-8000:]
    assert not marker.exists(), "the outage never happened"
    record = json.loads((tmp_path / "launcher_record" / "outage" / "launch.json").read_text())
    restarts = record["restarts"]
    assert [(r["service"], r["exit_status"], r["restarted"]) for r in restarts] == [("env", 17, True)], restarts
    assert "service 'env' exited with status 17 while training runs; starting it again" in stderr
    assert "is healthy again" in stderr
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]  # trained to the last step
    assert steps[2]["episode/restarts"] >= 1  # the episodes the outage took down ran again
    assert steps[2]["episode/count"] == 4
    assert "episode/failed" in steps[2]  # any episode its retries could not save is counted (and not trained on)
    if disk_full:
        assert all(m["dump/lost_episodes"] == 4 for m in steps.values())
        assert "rollout dump of step 1 NOT written" in output and "No space left on device" in output
    with contextlib.suppress(httpx.HTTPError):
        assert httpx.get(f"http://127.0.0.1:{env_port}/healthz", timeout=1).status_code != 200  # stopped at the end
