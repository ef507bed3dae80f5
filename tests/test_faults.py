"""The fault rules on real verl batches: who is kept out of the update, and when a step stops the run.

The end-to-end runs are in tests/test_training_faults.py; these pin the arithmetic: a failed row trains no
token and sets no baseline (the good rows' advantages equal verl's GRPO over the good rows alone), and the
stop rule's boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.ray_trainer import compute_advantage

from agentevolver.finished_run import checkpoint_step, finished_message
from agentevolver.verl.step.faults import TooManyFailures, check_failed_share, exclude_failed, failure_metrics


def batch_of(scores: list[float], groups: list[str], failures: list[str], width: int = 3) -> DataProto:
    n = len(scores)
    rewards = torch.zeros(n, width)
    rewards[:, -1] = torch.tensor(scores)
    others = np.empty(n, dtype=object)
    for row in range(n):
        others[row] = [{"prompt_ids": [1]}]  # an earlier sample of a multi-sample episode
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(n, width, dtype=torch.int64)},
        non_tensors={"uid": np.array(groups, dtype=object), "failure": np.array(failures, dtype=object),
                     "other_samples": others})
    return data


def advantages(batch: DataProto) -> DataProto:
    """The step's advantage stage, which runs after the ``faults`` stage."""
    return compute_advantage(batch, adv_estimator="grpo", num_repeat=2)


def test_a_failed_row_trains_nothing_and_sets_no_baseline() -> None:
    scores, groups = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0], ["a", "a", "a", "b", "b", "b"]
    failures = ["", "", "env", "", "grader", ""]
    batch = batch_of(scores, groups, failures)
    assert exclude_failed(batch) == 2
    batch = advantages(batch)
    mask = batch.batch["response_mask"]
    assert mask[[2, 4]].sum() == 0 and mask[[0, 1, 3, 5]].min() == 1
    assert batch.non_tensor_batch["other_samples"][2] == [] and batch.non_tensor_batch["other_samples"][0] != []
    good = [0, 1, 3, 5]
    expected, _ = compute_grpo_outcome_advantage(
        torch.tensor([[scores[i]] for i in good]), torch.ones(4, 1), np.array([groups[i] for i in good], dtype=object))
    got = batch.batch["advantages"]
    for k, row in enumerate(good):
        assert torch.allclose(got[row], torch.full((3,), float(expected[k, 0])), atol=1e-6)
    assert got[[2, 4]].abs().sum() == 0
    # group b's baseline without its failed 0: the two 1s tie, so neither gets an advantage
    assert got[3].abs().sum() == 0 and got[5].abs().sum() == 0
    assert len({batch.non_tensor_batch["uid"][i] for i in (2, 4)} & {"a", "b"}) == 0  # groups of their own


def test_a_batch_without_failures_is_left_alone() -> None:
    batch = batch_of([1.0, 0.0], ["a", "a"], ["", ""])
    before = batch.batch["response_mask"].clone()
    assert exclude_failed(batch) == 0
    assert torch.equal(batch.batch["response_mask"], before) and list(batch.non_tensor_batch["uid"]) == ["a", "a"]
    assert failure_metrics(batch.non_tensor_batch) == {
        "episode/failed": 0.0, "episode/failed_share": 0.0, "episode/failed/env": 0.0,
        "episode/failed/rollout": 0.0, "episode/failed/grader": 0.0, "episode/failed/program": 0.0}


@pytest.mark.parametrize(("failures", "share", "stops"), [
    (["", "", "", ""], 0.0, False),
    (["env", "", "", ""], 0.25, False),
    (["env", "env", "", ""], 0.5, False),     # at the limit: goes on
    (["env", "env", "rollout", ""], 0.5, True),
    (["env", "", "", ""], 0.0, True),         # max_failed_share 0: any failure stops
    (["env", "env", "env", "env"], 1.0, True),  # every episode failed: stops whatever the share
])
def test_the_stop_rule(failures: list[str], share: float, stops: bool) -> None:
    columns = {"failure": np.array(failures, dtype=object)}
    if not stops:
        check_failed_share(columns, share if share else 0.5, step=3)
        return
    limit = 0.5 if share >= 0.5 else share
    with pytest.raises(TooManyFailures) as caught:
        check_failed_share(columns, limit, step=3)
    message = str(caught.value)
    assert message.startswith("training step 3: ") and "agent_flow.max_failed_share" in message
    assert "x env: check the environment service (env_service.env_url" in message


def test_the_stop_quotes_the_most_common_error_and_points_at_the_dump() -> None:
    records = [{"error": "POST /v1/responses: 404 Not Found"}, {"error": "POST /v1/responses: 404 Not Found"},
               {"error": "timed out"}, {"error": None}]
    columns = {"failure": np.array(["program", "program", "program", ""], dtype=object),
               "episode_record": np.array(records, dtype=object)}
    with pytest.raises(TooManyFailures) as caught:
        check_failed_share(columns, 0.5, step=1, dump_path="/run/rollouts/step_1.jsonl")
    message = str(caught.value)
    assert ('The most common error (2 of the 3 failed episodes): program: "POST /v1/responses: 404 Not Found".'
            in message)
    assert message.endswith("every episode's error is in the step's rollout dump, /run/rollouts/step_1.jsonl")
    long = {"failure": np.array(["env"], dtype=object), "episode_record": np.array([{"error": "x" * 1000}])}
    with pytest.raises(TooManyFailures, match=r"env: \"x{400} \[\.\.\.\]\"\..*dump is off"):
        check_failed_share(long, 0.5, step=1)


def test_a_finished_run_is_recognised_from_verls_checkpoint_tracker(tmp_path) -> None:
    from omegaconf import OmegaConf

    def config(**trainer: object) -> object:
        return OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto",
                                             "total_training_steps": 4, "experiment_name": "exp", **trainer}})

    assert finished_message(config()) is None  # a fresh run
    (tmp_path / "global_step_4").mkdir()
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")
    message = finished_message(config())
    assert message is not None and "already trained to step 4 of trainer.total_training_steps=4" in message
    assert "trainer.resume_mode=disable" in message and "trainer.experiment_name" in message
    assert finished_message(config(total_training_steps=6)) is None  # more to train: resumes
    assert finished_message(config(resume_mode="disable")) is None
    assert finished_message(config(total_training_steps=None)) is None  # the trainer checks once it knows
    assert checkpoint_step(config(resume_mode="resume_path", resume_from_path="x/global_step_2").trainer) == 2
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("5")  # the tracker names a folder that is gone
    assert finished_message(config()) is None


def test_an_episode_that_failed_before_generating_still_carries_rollout_log_probs() -> None:
    """verl takes the batch's rollout_log_probs from the first episode's: one episode with None used to drop
    them for the whole batch (or break the concatenation), and bypass mode then ended the run."""
    from transformers import AutoTokenizer

    from agentevolver.models import resolve_model_path
    from agentevolver.module.agent_flow.episode import EpisodeResult
    from agentevolver.verl.agent_loop import to_agent_loop_output

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    result = EpisodeResult(task_id="t0", env_type="lottery", group_id="g", rollout_id=0, termination="env_error",
                           error="environment request failed: connection refused")
    output = to_agent_loop_output(result, tokenizer, response_length=8)
    assert output.response_ids == [] and output.response_mask == [] and output.response_logprobs == []
    assert output.extra_fields["failure"] == "env" and len(output.prompt_ids) == 1
    assert result.to_dump_record(step=1)["failure"] == "env"
