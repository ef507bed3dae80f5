"""The six Self-Navigating usage modes (seed 002, ``config/exp_mode/``) through the training entry point.

Each run is ``python -m agentevolver.main_ppo`` (tiny-test on the lottery environment, the trainer tests'
shrunk quickstart) against a real environment service and a real memory service
(``python -m agentevolver.memory_service``, MiniLM + faiss); the only double is the scripted
OpenAI-compatible server playing the memory's summariser LLM. The checks read what a user would: the
memory's workspaces, ``metrics.jsonl``, the rollout dumps and the process's exit code.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import env_service
from memory_service_fixture import Service, memory_service, task_summariser
from ports import free_port
from training_fixture import run_training, training_command, training_timeout

from agentevolver.config import compose_config
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("exp_env")) as running:
        yield running.url


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    from scripted_openai_server import shared_scripted_llm_server

    llm = shared_scripted_llm_server()
    folder = tmp_path_factory.mktemp("exp_memory")
    with memory_service(folder / "data", folder / "service.log", "--llm-base-url", llm.base_url,
                        "--llm-model", "scripted-model") as running:
        yield running


@pytest.fixture
def summariser(scripted_llm):
    scripted_llm.respond_with(task_summariser)
    return scripted_llm


def train(env: str, run_dir: Path, memory_url: str, workspace: str, mode: str, *extra: str,
          steps: int = 1) -> subprocess.CompletedProcess[str]:
    command = training_command(env, run_dir, f"exp_mode={mode}", f"memory.base_url={memory_url}",
                               f"memory.workspace_id={workspace}", f"trainer.total_training_steps={steps}",
                               "trainer.save_freq=-1", "exp_manager.init_exp_max_tasks=2", *extra)
    done = run_training(command, run_dir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done


def stored(memory: Service, workspace: str) -> list:
    return memory.client().list_memories(workspace)


def seed_workspace(memory: Service, workspace: str, tmp_path: Path) -> None:
    """An existing memory, imported from JSONL as a user would move one between machines."""
    # (worded unlike the scripted summariser's "Task tN: ...", so the run's own summaries are not duplicates)
    lines = [{"when_to_use": f"Lottery round number {i}", "content": f"EXP-t{i}: imported advice."} for i in range(10)]
    path = tmp_path / "seed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert memory.client().import_jsonl(workspace, path) == 10


def dumps(run_dir: Path, steps: int) -> list[dict]:
    return [r for step in range(1, steps + 1) for r in read_rollout_dump(run_dir / "run" / "rollouts" / f"step_{step}.jsonl")]


def decode(ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test")).decode(ids)


# ----------------------------------------------------------------------------------------- the six modes


def test_no_pool_is_the_default_and_adds_nothing() -> None:
    """no_pool restates the root config's switches (the plain-training e2e tests run in it)."""
    root, preset = compose_config(), compose_config(["exp_mode=no_pool"])
    for section in ("exp_manager", "memory"):
        assert root[section] == preset[section]
    assert root.actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    from agentevolver.config import validate_config
    from agentevolver.module.exp_manager.manager import ExperienceManager

    settings = validate_config(preset)
    assert not ExperienceManager(settings.exp_manager, settings.memory).active  # no rollout wrapper, no rows


def test_init_only_builds_a_memory_and_does_not_train(env, memory, summariser, tmp_path: Path) -> None:
    train(env, tmp_path, memory.url, "ws-init-only", "init_only")
    experiences = stored(memory, "ws-init-only")
    tasks = {m.content.split(":")[0] for m in experiences}
    assert 1 <= len(tasks) <= 2 and all(task.startswith("EXP-t") for task in tasks)  # init_exp_max_tasks=2
    assert all(m.score == pytest.approx(0.9) for m in experiences)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no training step ran
    assert not list((tmp_path / "run").glob("global_step_*"))


def test_init_train_update_guides_half_strips_them_and_grows_the_memory(env, memory, summariser,
                                                                       tmp_path: Path) -> None:
    """The full mode, with the quickstart's bypass mode (old log-probs = rollout log-probs) as well, in async
    training (step 2 is planned, retrieved and rolled out during step 1's update and summary)."""
    train(env, tmp_path, memory.url, "ws-itu", "init_train_update", "algorithm.rollout_correction.bypass_mode=true",
          "trainer.mode=async", steps=2)
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]
    assert steps[2]["async/staleness_max"] == 1.0
    first = steps[1]
    assert first["exp/init_episodes"] == 4  # 2 training tasks x 2 episodes, rolled out before step 1
    assert first["exp/init_cleared"] == 0  # a new workspace: nothing left by an earlier run to delete
    for metrics in steps.values():
        assert metrics["exp/injected_share"] == 0.5  # mixed, ratio 0.5: one of each group's two rollouts
        assert metrics["exp/stripped_share"] == 0.5  # alldiscard: every guided sample trained without it
        assert metrics["exp/retrieve_errors"] == 0
        assert metrics["exp/summary_submitted"] >= 1  # updated_freq 1: every step's episodes go to the memory
        # the worker trained with the exp_on_off loss: a quarter of the response tokens were off-policy
        assert 0.0 < metrics["actor/exp_token_frac"] < 1.0
    records = dumps(tmp_path, 2)
    guided = [r for r in records if any(m.get("author") == "experience" for m in r["messages"])]
    assert len(guided) == len(records) / 2
    for record in guided:
        experience = next(m["content"] for m in record["messages"] if m["author"] == "experience")
        assert "EXP-t" in experience and record["exp_mask"] is True
        assert "EXP-t" not in decode(record["prompt_ids"])  # what was trained on has no experience
    assert not any(r["exp_mask"] for r in records if r not in guided)
    assert len(stored(memory, "ws-itu")) > 0


# slow: the same run as init_train_update without its summaries; that no summary is due in this mode is
# tests/test_exp_manager.py::test_only_the_update_modes_summarise_during_training, the initial build is in
# test_init_train_update_guides_half_strips_them_and_grows_the_memory
@pytest.mark.slow
def test_init_train_builds_once_and_never_updates(env, memory, summariser, tmp_path: Path) -> None:
    train(env, tmp_path, memory.url, "ws-it", "init_train")
    after_init = len(summariser.requests)
    assert after_init > 0 and stored(memory, "ws-it")
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")[1]
    assert metrics["exp/injected_share"] == 0.5 and "exp/summary_submitted" not in metrics


# slow: exist_train_update's run reads the same imported memory; that this mode never summarises is
# tests/test_exp_manager.py::test_only_the_update_modes_summarise_during_training
@pytest.mark.slow
def test_exist_train_reads_an_existing_memory_and_leaves_it_alone(env, memory, summariser, tmp_path: Path) -> None:
    seed_workspace(memory, "ws-exist", tmp_path)
    train(env, tmp_path, memory.url, "ws-exist", "exist_train")
    assert summariser.requests == []  # nothing summarised
    assert len(stored(memory, "ws-exist")) == 10
    records = dumps(tmp_path, 1)
    experiences = [m["content"] for r in records for m in r["messages"] if m.get("author") == "experience"]
    assert len(experiences) == 2 and all("imported advice" in text for text in experiences)


def test_exist_train_update_adds_to_the_existing_memory(env, memory, summariser, tmp_path: Path) -> None:
    """Also: the final validation runs twice on the same weights (exp_manager.val_compare_mode=all), without
    experience and with it, and both passes are logged under their own names."""
    seed_workspace(memory, "ws-exist-update", tmp_path)
    dumps_dir = tmp_path / "val_dumps"
    train(env, tmp_path, memory.url, "ws-exist-update", "exist_train_update", "trainer.test_freq=1",
          "data.val_max_samples=2", "exp_manager.val_compare_mode=all", f"trainer.validation_data_dir={dumps_dir}")
    assert len(summariser.requests) > 0
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")[1]
    assert metrics["exp/summary_submitted"] >= 1 and metrics["exp/injected_share"] == 0.5
    assert metrics["val-aux/lottery/experience/mean@1"] == 0.0  # val_rollout_mode woexp
    assert metrics["val-aux/lottery/failed/mean@1"] == 0.0  # no service failed (the ablation report reads it)
    assert metrics["val-exp_all-aux/lottery/experience/mean@1"] == 1.0  # the second pass: every episode
    assert "val-core/lottery/acc/mean@1" in metrics and "val-exp_all-core/lottery/acc/mean@1" in metrics
    # verl's generation dumps of the two passes, one file each (the second pass's in its own folder)
    first, second = (dumps_dir / "1.jsonl").read_text(), (dumps_dir / "exp_all" / "1.jsonl").read_text()
    assert len(first.splitlines()) == len(second.splitlines()) == 2
    assert all(json.loads(line)["experience"] == 0.0 for line in first.splitlines())
    assert all(json.loads(line)["experience"] == 1.0 for line in second.splitlines())
    # the step's summaries ran in the background; the trainer waits for them before it exits
    assert len(stored(memory, "ws-exist-update")) > 10


# slow: a memory service that does not answer costs no episode and is counted in
# tests/test_exp_manager.py::test_memory_service_down_counts_failures_and_never_raises (retrieval and summaries),
# and a real run goes on while its memory service is down in tests/test_launcher.py (the memory-outage run)
@pytest.mark.slow
def test_memory_service_down_means_no_experience_and_counted_failures(env, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    done = train(env, tmp_path, dead, "ws-none", "exist_train_update", "memory.max_retries=0")
    assert "does not answer" in done.stdout + done.stderr
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")[1]
    assert metrics["exp/injected_share"] == 0.0 and metrics["exp/retrieve_errors"] == 2  # one per guided group
    assert metrics["exp/summary_submitted"] >= 1
    assert "experience summary failed" in done.stdout + done.stderr  # counted and logged, not raised
    assert metrics["episode/count"] == 4  # every episode ran, without experience


def test_rollout_cli_measures_a_memory(env, memory, tmp_path: Path) -> None:
    """``python -m agentevolver.rollout`` with a memory: every episode gets the memory's experience, as a
    validation rollout in ``val_rollout_mode=all`` would."""
    import os
    import sys

    from env_service_fixture import REPO_ROOT

    seed_workspace(memory, "ws-rollout", tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "agentevolver.rollout", "--config-name", "quickstart", "--split", "val",
         "--num-tasks", "2", "actor_rollout_ref.model.path=tiny-test",
         f"env_service.env_url={env}", "env_service.env_type=lottery", "env_service.create_params={}",
         "exp_mode=exist_train", "exp_manager.val_rollout_mode=all", f"memory.base_url={memory.url}",
         "memory.workspace_id=ws-rollout", "agent_flow.max_tokens_per_turn=8",
         "--n", "2", "--run-dir", str(tmp_path)],  # options after overrides work too
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if "with experience" in line)
    assert row.replace("│", " ").split()[-1] == "4"
    records = list(read_rollout_dump(tmp_path / "rollouts" / "step_0.jsonl"))
    assert len(records) == 4
    assert all(any(m.get("author") == "experience" and "imported advice" in m["content"] for m in r["messages"])
               for r in records)
    assert not any(r["exp_mask"] for r in records)  # nothing is trained, nothing stripped
