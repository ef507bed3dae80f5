"""Multi-sample episodes become training rows (agentevolver.verl.step.sample_rows): layout, advantages, padding,
the episode rows first, and a gradient through verl's real policy loss on the earlier samples' tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig

from agentevolver.verl.step.sample_rows import (
    SAMPLE_PARENT,
    SAMPLE_ROLE,
    episode_rows,
    expand_sample_rows,
    refusal,
    spread_advantages,
)

PAD = 0
P, R = 6, 5  # prompt and response widths of the batch


def _row(prompt: list[int], response: list[int], mask: list[int]) -> dict[str, torch.Tensor]:
    prompts = torch.zeros(P, dtype=torch.long)
    prompts[P - len(prompt):] = torch.tensor(prompt)
    responses = torch.zeros(R, dtype=torch.long)
    responses[: len(response)] = torch.tensor(response)
    attention = torch.cat([torch.arange(P) >= P - len(prompt), torch.arange(R) < len(response)]).long()
    response_mask = torch.zeros(R, dtype=torch.long)
    response_mask[: len(mask)] = torch.tensor(mask)
    return {"prompts": prompts, "responses": responses, "attention_mask": attention, "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses]),
            "position_ids": torch.clip(torch.cumsum(attention, 0) - 1, min=0)}


def _objects(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _episode_batch() -> DataProto:
    """Two episodes of one GRPO group as the rollout returns them: episode 0 has one earlier sample (2 policy
    tokens, step 0), episode 1 none."""
    rows = [_row([11, 12, 13], [21, 22, 23], [1, 1, 1]), _row([11, 12], [31, 32], [1, 1])]
    tensors = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
    mask = tensors["response_mask"].float()
    tensors["token_level_scores"] = torch.zeros(2, R)
    tensors["rollout_log_probs"] = -0.5 * mask
    tensors["dummy_tensor"] = torch.tensor([[5], [6]])  # verl's per-row placeholder: copied from the episode
    earlier = {"prompt_ids": [11, 12], "response_ids": [41, 42, 43], "response_mask": [1, 0, 1],
               "step_ids": [0, -1, 0], "response_logprobs": [-0.1, 0.0, -0.2], "exp_mask": True}
    others = _objects([[earlier], []])
    non_tensor = {"uid": np.array(["g", "g"], dtype=object), "other_samples": others,
                  "exp_mask": np.array([False, False], dtype=object),
                  "step_ids": _objects([[1, 1, 1], [0, 0]])}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor, meta_info={"global_token_num": [6, 4]})


def _with_advantages(rows: DataProto, episodes: int = 2, table: list | None = None) -> DataProto:
    """What the advantage stage does: GRPO advantages +1 / -1 on the episode rows, spread to the others."""
    batch = episode_rows(rows, episodes)
    batch.batch["advantages"] = torch.tensor([[1.0], [-1.0]]) * batch.batch["response_mask"].float()
    batch.batch["returns"] = batch.batch["advantages"].clone()
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    if table is not None:
        batch.non_tensor_batch["step_advantages"] = _objects(table)
    spread_advantages(rows, batch)
    return rows


def test_earlier_samples_become_rows_with_the_episodes_advantage() -> None:
    batch = _episode_batch()
    rows, metrics = expand_sample_rows(batch, pad_token_id=PAD, rows_per_minibatch=2, bypass=True)
    assert metrics["train/episode_rows"] == 2 and metrics["train/earlier_sample_rows"] == 1
    assert metrics["train/pad_rows"] == 1 and len(rows) == metrics["train/rows"] == 4
    assert list(rows.non_tensor_batch[SAMPLE_ROLE]) == ["final", "final", "earlier", "pad"]
    assert list(rows.non_tensor_batch[SAMPLE_PARENT]) == [0, 1, 0, 0]
    _with_advantages(rows)
    added = rows[2]
    # verl's agent-loop layout: prompt left-padded, response right-padded, positions from the attention mask
    assert added.batch["prompts"].tolist() == [0, 0, 0, 0, 11, 12]
    assert added.batch["responses"].tolist() == [41, 42, 43, 0, 0]
    assert added.batch["input_ids"].tolist() == [0, 0, 0, 0, 11, 12, 41, 42, 43, 0, 0]
    assert added.batch["attention_mask"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert added.batch["position_ids"].tolist() == [0, 0, 0, 0, 0, 1, 2, 3, 4, 4, 4]
    assert added.batch["response_mask"].tolist() == [1, 0, 1, 0, 0]
    # the episode's advantage (+1) on the earlier sample's policy tokens; its own rollout log-probs
    assert added.batch["advantages"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert added.batch["returns"].tolist() == added.batch["advantages"].tolist()
    assert added.batch["rollout_log_probs"].tolist() == pytest.approx([-0.1, 0.0, -0.2, 0.0, 0.0])
    assert added.batch["token_level_rewards"].abs().sum() == 0 and added.batch["token_level_scores"].abs().sum() == 0
    assert added.non_tensor_batch["exp_mask"] is True and added.non_tensor_batch["uid"] == "g"
    assert added.non_tensor_batch["step_ids"].tolist() == [0, -1, 0, -1, -1]
    assert added.batch["dummy_tensor"].tolist() == [5]
    # the episode rows keep their own advantages; padding trains nothing
    assert rows[0].batch["advantages"].tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert rows[3].batch["response_mask"].sum() == 0 and rows[3].batch["advantages"].abs().sum() == 0
    # the caller's episode batch is unchanged
    assert len(batch) == 2 and "other_samples" in batch.non_tensor_batch
    assert batch.meta_info["global_token_num"] == [6, 4]
    assert rows.meta_info["global_token_num"] == rows.batch["attention_mask"].sum(-1).tolist()


def test_adca_step_advantages_reach_earlier_samples_through_their_step_ids() -> None:
    rows, _ = expand_sample_rows(_episode_batch(), pad_token_id=PAD, rows_per_minibatch=1, bypass=True)
    assert len(rows) == 3
    _with_advantages(rows, table=[[0.75, -0.25], None])  # episode 0 labelled: step 0 -> 0.75, step 1 -> -0.25
    assert rows[2].batch["advantages"].tolist() == [0.75, 0.0, 0.75, 0.0, 0.0]


def test_the_episode_rows_come_first_so_the_advantage_sees_each_episode_once() -> None:
    rows, _ = expand_sample_rows(_episode_batch(), pad_token_id=PAD, rows_per_minibatch=2, bypass=False)
    episodes = episode_rows(rows, 2)
    assert len(episodes) == 2 and list(episodes.non_tensor_batch[SAMPLE_ROLE]) == ["final", "final"]
    assert torch.equal(episodes.batch["responses"], _episode_batch().batch["responses"])
    assert "old_log_probs" not in rows.batch  # the step's log-prob pass computes them for every row at once


def test_a_column_it_cannot_fill_is_an_error_naming_it() -> None:
    batch = _episode_batch()
    batch.batch["values"] = torch.zeros(2, R)
    with pytest.raises(ValueError, match="values"):
        expand_sample_rows(batch, pad_token_id=PAD, rows_per_minibatch=1, bypass=True)


def test_without_earlier_samples_the_rows_are_the_episodes() -> None:
    batch = _episode_batch()
    batch.non_tensor_batch["other_samples"][0] = []
    rows, metrics = expand_sample_rows(batch, pad_token_id=PAD, rows_per_minibatch=2, bypass=True)
    assert len(rows) == 2 and metrics["train/pad_rows"] == 0
    assert episode_rows(rows, 2) is rows
    _with_advantages(rows)
    assert rows.batch["advantages"][1].tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0]


def test_the_earlier_sample_gets_a_gradient_from_verls_policy_loss() -> None:
    """verl's vanilla PPO loss over the expanded rows: the earlier sample's policy tokens get a non-zero
    gradient, its observation token and the padding row none."""
    rows, _ = expand_sample_rows(_episode_batch(), pad_token_id=PAD, rows_per_minibatch=2, bypass=True)
    _with_advantages(rows)
    old = rows.batch["rollout_log_probs"]  # bypass mode: the rollout's log-probs are the old ones
    log_prob = old.clone().requires_grad_(True)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    loss, _ = core_algos.compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=log_prob, advantages=rows.batch["advantages"],
        response_mask=rows.batch["response_mask"], loss_agg_mode="token-mean", config=config)
    loss.backward()
    grad = log_prob.grad
    assert grad[2, 0] != 0 and grad[2, 2] != 0  # the earlier sample's two policy tokens
    assert grad[2, 1] == 0 and grad[3].abs().sum() == 0  # its observation token, the padding row


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"use_critic": True}, "critic"),
    ({"adv_estimator": "gae"}, "outcome-level"),
    ({"distillation": True}, "distillation"),
])
def test_combinations_that_cannot_train_every_sample_are_refused(kwargs: dict, needle: str) -> None:
    settings = {"multi_sample": True, "adv_estimator": "grpo", "use_critic": False, "distillation": False, **kwargs}
    assert needle in refusal(**settings)
    assert refusal(**{**settings, "multi_sample": False}) is None
