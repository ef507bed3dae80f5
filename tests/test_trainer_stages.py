"""The trainer's own stages, each on real inputs: task datasets from the real service, episode metrics,
dump records from a verl DataProto, and config preparation of the training entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from env_service_fixture import env_service
from verl import DataProto
from verl.utils.dataset.rl_dataset import collate_fn

from agentevolver.client.env_client import EnvClient, EnvClientSettings
from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.schema import Task, TaskObjective
from agentevolver.verl.agent_loop import episode_spec_from_row
from agentevolver.verl.step.dump import dump_records
from agentevolver.verl.step.episode_metrics import episode_metrics
from agentevolver.verl.task_dataset import TaskDataset, tasks_from_env_service


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("echo", tmp_path=tmp_path_factory.mktemp("stages")) as running:
        yield running.url


def test_task_rows_come_from_the_env_splits_and_collate_like_verl(service: str) -> None:
    with EnvClient(EnvClientSettings(env_url=service)) as env:
        train = tasks_from_env_service(env, "echo", "train")
        val = tasks_from_env_service(env, "echo", "val", limit=1, grader="llm")
        spread = tasks_from_env_service(env, "echo", "train", limit=3)
    assert [t.task.task_id for t in train] == [f"t{i}" for i in range(8)] and len(val) == 1
    assert [t.task.task_id for t in spread] == ["t0", "t2", "t5"]  # spread over the split, not its head
    assert train[0] == TaskObjective(task=Task(task_id="t0", env_type="echo"), source="original")
    assert val[0].task.evaluator == "llm"
    dataset = TaskDataset(train, {"level": 2})
    batch = DataProto.from_single_dict(collate_fn([dataset[0], dataset[1]]))
    assert len(batch) == 2
    # The task objective itself, typed, with the /create parameters beside it: no JSON round trip.
    assert batch.non_tensor_batch["task"][1] is train[1]
    assert list(batch.non_tensor_batch["env_params"]) == [{"level": 2}, {"level": 2}]
    # ... and it reaches the episode as it left the task manager (verl repeats rows for rollout.n).
    repeated = batch.repeat(repeat_times=2, interleave=True)
    spec = episode_spec_from_row({k: v[2] for k, v in repeated.non_tensor_batch.items()})
    assert spec.task is train[1].task and spec.env_params == {"level": 2}
    assert list(batch.non_tensor_batch["agent_name"]) == ["agentevolver", "agentevolver"]
    assert list(batch.non_tensor_batch["data_source"]) == ["echo", "echo"]


def test_bad_task_rows_fail_at_load(service: str) -> None:
    with pytest.raises(ConfigError, match="empty"):
        TaskDataset([])
    with pytest.raises(ConfigError, match="task 0 is a dict, not a TaskObjective"):
        TaskDataset([{"env_type": "echo"}])
    with EnvClient(EnvClientSettings(env_url=service, max_retries=0)) as env, \
            pytest.raises(ConfigError, match="'nope' tasks of environment 'echo'"):
        tasks_from_env_service(env, "echo", "nope")


def test_episode_metrics_hand_example() -> None:
    batch = {
        "termination": np.array(["finished", "finished", "max_steps", "env_error"], dtype=object),
        "reward_success_rate": np.array([1.0, 0.0, 0.0, 0.0]),
        "reward_madness": np.array([0.0, -1.0, 0.0, 0.0]),
        "episode_metrics": np.array([
            {"episode/generated_tokens": 10.0, "time/generate_s": 1.0, "episode/env_errors": 0.0},
            {"episode/generated_tokens": 20.0, "time/generate_s": 3.0, "episode/parse_errors": 2.0},
            {"episode/generated_tokens": 30.0, "time/generate_s": 2.0, "tool/calls": 3.0},
            {"episode/env_errors": 1.0},
        ], dtype=object),
    }
    metrics = episode_metrics(batch)
    assert metrics["episode/count"] == 4 and metrics["episode/success_rate"] == 0.25
    assert metrics["episode/madness_share"] == 0.25
    assert metrics["episode/ended/finished"] == 0.5 and metrics["episode/ended/env_error"] == 0.25
    assert metrics["episode/ended/budget"] == 0.0
    assert metrics["episode/generated_tokens_mean"] == 20.0 and metrics["episode/time_generate_s_mean"] == 2.0
    assert metrics["episode/env_errors"] == 1.0 and metrics["episode/parse_errors"] == 2.0
    assert metrics["episode/tool_calls"] == 3.0
    assert episode_metrics({}) == {}
    assert "exp/success_with_experience" not in metrics  # no episode of the batch reported experience


def test_success_with_and_without_experience_in_one_batch() -> None:
    batch = {
        "termination": np.array(["finished"] * 4, dtype=object),
        "reward_success_rate": np.array([1.0, 1.0, 0.0, 1.0]),
        "episode_metrics": np.array([{"exp/injected": 1.0}, {"exp/injected": 1.0}, {"exp/injected": 0.0},
                                     {"exp/injected": 0.0}], dtype=object),
    }
    metrics = episode_metrics(batch)
    assert metrics["exp/success_with_experience"] == 1.0 and metrics["exp/success_without_experience"] == 0.5
    assert metrics["exp/injected_share"] == 0.5


def test_dump_records_carry_each_episodes_advantages(tmp_path: Path) -> None:
    records = [{"task_id": "a", "response_ids": [1, 2, 3], "messages": [{"role": "user"}]},
               {"task_id": "b", "response_ids": [4], "messages": []}]
    advantages = torch.tensor([[0.5, 0.5, 0.5, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    batch = DataProto.from_dict(tensors={"advantages": advantages},
                                non_tensors={"episode_record": np.array(records, dtype=object)})
    out = dump_records(batch, step=7)
    assert [r["step"] for r in out] == [7, 7]
    assert out[0]["advantages"] == [0.5, 0.5, 0.5] and out[1]["advantages"] == [-1.0]
    assert "messages" not in dump_records(batch, step=7, include_messages=False)[0]
    from agentevolver.module.agent_flow import RolloutDumpWriter

    path = RolloutDumpWriter(tmp_path).write_records(7, out)
    assert [r["task_id"] for r in read_rollout_dump(path)] == ["a", "b"]


def test_prepare_config_resolves_the_model_and_points_dumps_at_the_run_dir(tmp_path: Path) -> None:
    cfg = prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test",
                                         f"trainer.default_local_dir={tmp_path}"]))
    assert cfg.actor_rollout_ref.model.path == str(resolve_model_path("tiny-test"))
    assert cfg.agent_flow.dump.dir == str(tmp_path / "rollouts")
    moved = prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test", "agent_flow.dump.dir=/x/y"]))
    assert moved.agent_flow.dump.dir == "/x/y"
    with pytest.raises(ConfigError, match=r"agent_flow\.max_steps"):
        prepare_config(compose_config(["agent_flow.max_steps=0"]))


def test_no_reward_loop_worker_unless_a_reward_model_needs_one() -> None:
    """The CPU preset starts no reward-loop worker (our agent loop scores every episode); a reward model needs one."""
    cfg = prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test"], config_name="quickstart"))
    assert cfg.reward.num_workers == 0
    with pytest.raises(ConfigError, match=r"reward\.num_workers: 0 .* reward\.reward_model\.enable"):
        prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test", "reward.reward_model.enable=true"],
                                      config_name="quickstart"))
