"""A game's trained seats become episode rows of their own (agentevolver.verl.step.seat_rows): one row per seat
with its own tokens, score and failure, GRPO groups per (task, seat role), and a failed seat kept out alone."""

from __future__ import annotations

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from agentevolver.verl.step.faults import exclude_failed
from agentevolver.verl.step.seat_rows import SEAT_COLUMN, expand_seat_rows

P, R = 6, 5


def _objects(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _sample(prompt: list[int], response: list[int]) -> dict:
    return {"prompt_ids": prompt, "response_ids": response, "response_mask": [1] * len(response),
            "step_ids": [0] * len(response), "response_logprobs": [-0.5] * len(response), "exp_mask": False}


def _games(scores: list[tuple[float, float]], failures: tuple[str | None, str | None] = (None, None)) -> DataProto:
    """Games of one task as the rollout returns them: X's sample first (earlier), O's the row's own (final)."""
    rows, records, others = [], [], []
    for game, (x, o) in enumerate(scores):
        sample_x, sample_o = _sample([1, 2, 3], [10 + game, 11]), _sample([4, 5], [20 + game, 21, 22])
        seats = [{"seat": "X", "player": "policy", "trained": True, "score": x, "success": x >= 1.0,
                  "failure": failures[0], "error": "boom" if failures[0] else None, "samples": [0],
                  "messages": [{"role": "user", "content": "as X"}]},
                 {"seat": "O", "player": "policy", "trained": True, "score": o, "success": o >= 1.0,
                  "failure": failures[1], "error": "boom" if failures[1] else None, "samples": [1],
                  "messages": [{"role": "user", "content": "as O"}]},
                 {"seat": "Z", "player": "scripted:random", "trained": False, "score": 0.0, "success": False,
                  "failure": None, "error": None, "samples": [], "messages": []}]
        records.append({**sample_o, "task_id": "t", "group_id": "u", "instance_id": f"i{game}", "error": None,
                        "failure": None, "reward": {"outcome": (x + o) / 2}, "messages": [], "other_samples": [],
                        "game": {"seats": seats, "moves": []}})
        others.append([sample_x])
        prompts = torch.zeros(P, dtype=torch.long)
        prompts[-2:] = torch.tensor([4, 5])
        responses = torch.zeros(R, dtype=torch.long)
        responses[:3] = torch.tensor(sample_o["response_ids"])
        attention = torch.cat([torch.arange(P) >= P - 2, torch.arange(R) < 3]).long()
        rows.append({"prompts": prompts, "responses": responses, "attention_mask": attention,
                     "response_mask": (torch.arange(R) < 3).long(), "input_ids": torch.cat([prompts, responses]),
                     "position_ids": torch.clip(torch.cumsum(attention, 0) - 1, min=0)})
    tensors = {key: torch.stack([r[key] for r in rows]) for key in rows[0]}
    tensors["token_level_scores"] = torch.zeros(len(rows), R)
    tensors["rollout_log_probs"] = -0.5 * tensors["response_mask"].float()
    count = len(rows)
    non_tensor = {"uid": np.array(["u"] * count, dtype=object), "episode_record": _objects(records),
                  "other_samples": _objects(others), "failure": np.array([""] * count, dtype=object),
                  "exp_mask": np.array([False] * count, dtype=object), "reward_outcome": np.zeros(count),
                  "step_ids": _objects([np.array([0, 0, 0, -1, -1], dtype=np.int32)] * count)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensor)


def test_each_trained_seat_is_an_episode_row_with_its_own_tokens_score_and_group() -> None:
    rows, metrics = expand_seat_rows(_games([(1.0, 0.0), (0.0, 1.0)]), pad_token_id=0, bypass=False)
    assert len(rows) == 4 and metrics["game/seat_rows"] == 4 and metrics["game/games"] == 2
    assert list(rows.non_tensor_batch[SEAT_COLUMN]) == ["X", "O", "X", "O"]
    assert list(rows.non_tensor_batch["uid"]) == ["u/X", "u/O", "u/X", "u/O"]
    assert rows.batch["responses"][0, :2].tolist() == [10, 11] and rows.batch["responses"][1, :3].tolist() == [20, 21, 22]
    assert rows.batch["prompts"][0, -3:].tolist() == [1, 2, 3]
    scores = rows.batch["token_level_scores"]
    assert scores[0, 1] == 1.0 and scores[1, 2] == 0.0 and scores[2, 1] == 0.0 and scores[3, 2] == 1.0
    assert scores.sum() == 2.0  # one score per row, on its last response token
    records = rows.non_tensor_batch["episode_record"]
    assert [r["seat"] for r in records] == ["X", "O", "X", "O"] and records[0]["messages"][0]["content"] == "as X"
    assert records[0]["reward"]["outcome"] == 1.0 and records[0]["response_ids"] == [10, 11]
    assert metrics["game/win_rate/X"] == 0.5 and metrics["game/score/O"] == 0.5


def test_advantages_are_normalised_within_a_role() -> None:
    rows, _ = expand_seat_rows(_games([(1.0, 0.0), (0.0, 1.0)]), pad_token_id=0, bypass=False)
    advantages, _ = compute_grpo_outcome_advantage(rows.batch["token_level_scores"], rows.batch["response_mask"],
                                                   index=rows.non_tensor_batch["uid"])
    per_row = [float(advantages[i][rows.batch["response_mask"][i].bool()][0]) for i in range(4)]
    # X: won then lost -> +, -; O: lost then won -> -, +; a shared per-game group would give every row 0
    assert per_row[0] > 0 > per_row[2] and per_row[1] < 0 < per_row[3]
    assert abs(per_row[0] + per_row[2]) < 1e-5 and abs(per_row[1] + per_row[3]) < 1e-5


def test_a_failed_seat_is_kept_out_alone() -> None:
    rows, _ = expand_seat_rows(_games([(1.0, 0.0), (0.0, 1.0)], failures=(None, "rollout")), pad_token_id=0,
                               bypass=False)
    assert list(rows.non_tensor_batch["failure"]) == ["", "rollout", "", "rollout"]
    assert exclude_failed(rows) == 2
    assert rows.batch["response_mask"][[0, 2]].sum() > 0 and rows.batch["response_mask"][[1, 3]].sum() == 0
    assert list(rows.non_tensor_batch["uid"][[0, 2]]) == ["u/X", "u/X"]


def test_rows_that_are_not_games_pass_through() -> None:
    batch = _games([(1.0, 0.0)])
    batch.non_tensor_batch["episode_record"][0].pop("game")
    rows, metrics = expand_seat_rows(batch, pad_token_id=0, bypass=False)
    assert len(rows) == 1 and metrics["game/games"] == 0
