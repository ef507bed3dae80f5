"""Stage ``seat_rows``: a game's trained seats become episode rows of their own, grouped per role.

A game episode (:mod:`agentevolver.module.agent_flow.game`) is one row of verl's batch holding the samples of
every trained seat, and its record's ``game.seats`` says which samples are whose, each seat's score and
failure. Right after the ``reward`` stage, this stage replaces that row with **one episode row per trained
seat** that has samples: the seat's last sample laid out as verl's agent loop lays out a row (the layout of
:func:`agentevolver.verl.step.sample_rows._earlier_rows`), its earlier samples as the row's ``other_samples``,
and

* ``uid`` = ``<the task's uid>/<seat>``: GRPO's groups are (task, seat role), so advantages are normalised
  within a role (X against X, O against O), never across roles whose scores differ by construction;
* ``token_level_scores`` = the seat's own score (on its last response token, where verl's agent loop puts an
  episode's); the reward columns and the dump record are the seat's;
* ``failure`` = the seat's own (``rollout`` for a seat whose generation failed, ``env`` when the environment
  failed the whole game), so the ``faults`` stage that follows keeps exactly that seat's samples out of the
  update; ADCA (which groups by ``uid`` and labels the record's messages, the seat's own view) works per seat.

Rows without a game pass through unchanged, so a run that is not a game pays one scan of the records. A game
row none of whose trained seats generated anything (the environment failed at /create) stays as it is.
Metrics: ``game/games``, ``game/seat_rows``, ``game/score/<seat>``, ``game/win_rate/<seat>``,
``game/opponent_failed``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from agentevolver.verl.step.sample_rows import SAMPLE_PARENT, SAMPLE_ROLE, _earlier_rows, _pad_id

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["SEAT_COLUMN", "expand_seat_rows", "seat_rows"]

#: Added column: the seat a row's samples were played from ("" for a row that is not a game seat's).
SEAT_COLUMN = "seat"
_TOKEN_KEYS = ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "step_ids", "exp_mask")


def seat_rows(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``seat_rows`` (module docstring); a batch without games is returned as it is."""
    records = state.batch.non_tensor_batch.get("episode_record")
    if records is None or not any(isinstance(r, dict) and r.get("game") for r in records):
        return state
    rows, metrics = expand_seat_rows(state.batch, pad_token_id=_pad_id(trainer.tokenizer), bypass=trainer.bypass)
    state.metrics.update(metrics)
    state.batch = rows
    return state


def _game_samples(record: dict[str, Any], others: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Every sample of a game episode in its result's order: the earlier ones, then the final one."""
    samples = list(others or [])
    if record.get("response_ids") is not None and record.get("prompt_ids"):
        samples.append({key: record.get(key) for key in _TOKEN_KEYS})
    return samples


def _seat_record(record: dict[str, Any], seat: dict[str, Any], final: dict[str, Any],
                 earlier: list[dict[str, Any]], uid: str) -> dict[str, Any]:
    """The dump record of one seat's row: the game's record with the seat's tokens, reward and view."""
    reward = dict(record.get("reward") or {})
    reward.update(outcome=float(seat["score"]), success_rate=1.0 if seat["success"] else 0.0,
                  description=f"seat {seat['seat']}: game score {seat['score']:g}")
    out = {**record, **{key: final.get(key) for key in _TOKEN_KEYS}}
    out.update(seat=seat["seat"], group_id=uid, reward=reward, success=bool(seat["success"]),
               failure=seat["failure"], error=seat["error"] or record.get("error"), messages=seat["messages"],
               other_samples=[{key: sample.get(key) for key in _TOKEN_KEYS} for sample in earlier],
               num_turns=len({step for step in final.get("step_ids") or () if step >= 0}))
    return out


def expand_seat_rows(batch: Any, *, pad_token_id: int, bypass: bool) -> tuple[Any, dict[str, float]]:
    """The batch with each game row replaced by its trained seats' rows (module docstring) and ``game/*``
    metrics. The rows that are not games keep their order and come first."""
    from verl import DataProto

    columns = batch.non_tensor_batch
    records, others = columns["episode_record"], columns.get("other_samples")
    keep: list[int] = []
    parents: list[int] = []
    finals: list[dict[str, Any]] = []
    seats: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]] = []
    scores: dict[str, list[float]] = defaultdict(list)
    wins: dict[str, list[float]] = defaultdict(list)
    games = opponent_failed = 0
    for index, record in enumerate(records):
        game = record.get("game") if isinstance(record, dict) else None
        if not game:
            keep.append(index)
            continue
        games += 1
        samples = _game_samples(record, others[index] if others is not None else None)
        made = 0
        for seat in game["seats"]:
            if not seat["trained"]:
                opponent_failed += bool(seat["failure"])
                continue
            scores[seat["seat"]].append(float(seat["score"]))
            wins[seat["seat"]].append(1.0 if seat["score"] >= 1.0 else 0.0)
            mine = [samples[j] for j in seat["samples"]]
            if not mine:
                continue
            parents.append(index)
            finals.append(mine[-1])
            seats.append((record, seat, mine[:-1]))
            made += 1
        if not made:
            keep.append(index)
    metrics = {"game/games": float(games), "game/seat_rows": float(len(seats)),
               "game/opponent_failed": float(opponent_failed)}
    metrics.update({f"game/score/{seat}": float(np.mean(values)) for seat, values in scores.items()})
    metrics.update({f"game/win_rate/{seat}": float(np.mean(values)) for seat, values in wins.items()})
    if not seats:
        return batch, metrics
    meta = {key: value for key, value in batch.meta_info.items() if key != "global_token_num"}
    added = _earlier_rows(batch, parents, finals, pad_token_id, bypass, meta)
    for column in (SAMPLE_ROLE, SAMPLE_PARENT):
        added.non_tensor_batch.pop(column, None)
    _seat_columns(added, seats, finals)
    kept = batch.select_idxs(np.asarray(keep, dtype=np.int64))
    kept.meta_info = dict(meta)
    kept.non_tensor_batch[SEAT_COLUMN] = np.array([""] * len(kept), dtype=object)
    rows = DataProto.concat([kept, added]) if len(kept) else added
    if "attention_mask" in rows.batch:
        rows.meta_info["global_token_num"] = torch.sum(rows.batch["attention_mask"], dim=-1).tolist()
    return rows, metrics


def _seat_columns(rows: Any, seats: list[tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]],
                  finals: list[dict[str, Any]]) -> None:
    """Give each seat row its seat's group, failure, reward, earlier samples and record (module docstring)."""
    columns = rows.non_tensor_batch
    count = len(seats)
    uid, failure, record_col, other_col, seat_col = (np.empty(count, dtype=object) for _ in range(5))
    for key in ("reward_outcome", "reward_success_rate", "acc", "outcome", "group_id"):
        if key in columns:  # object columns: a fixed-width string column would cut "<uid>/<seat>" short
            columns[key] = np.asarray(columns[key], dtype=object)
    for row, ((record, seat, earlier), final) in enumerate(zip(seats, finals, strict=True)):
        uid[row] = f"{columns['uid'][row]}/{seat['seat']}"
        failure[row] = seat["failure"] or ""
        other_col[row] = earlier
        seat_col[row] = seat["seat"]
        record_col[row] = _seat_record(record, seat, final, earlier, uid[row])
        score = float(seat["score"])
        last = max(len(final.get("response_ids") or ()) - 1, 0)
        for key in ("token_level_scores", "rm_scores"):
            if key in rows.batch:
                rows.batch[key][row] = 0.0
                rows.batch[key][row, last] = score
        for key, value in (("reward_outcome", score), ("reward_success_rate", 1.0 if seat["success"] else 0.0),
                           ("acc", 1.0 if seat["success"] else 0.0), ("outcome", score), ("group_id", uid[row])):
            if key in columns:
                columns[key][row] = value
    columns["uid"], columns["failure"], columns["episode_record"] = uid, failure, record_col
    columns["other_samples"], columns[SEAT_COLUMN] = other_col, seat_col
