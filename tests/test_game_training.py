"""End to end: games train through ``python -m agentevolver.main_ppo`` and the real env service (``game``).

Two trained seats (tic-tac-toe self-play, X and O both the policy) for one GRPO step with the ``tiny-test``
model (every check is per step; the weight sync between steps is other runs' to prove): each game becomes one
episode row per seat, the GRPO groups are (task, seat role) and the advantages are normalised within each such
group. Then one trained seat against an opponent endpoint that never answers: the
opponent's seat resigns, its failure is recorded against it alone, and the trained seat's rows train.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import env_service
from fastapi.testclient import TestClient
from ports import free_port
from training_fixture import run_training, training_command, training_timeout

from agentevolver.logview import create_app
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout

#: A seat's response holds its moves and the boards it is shown between them (~50 tokens a move); illegal moves
#: become random legal ones (``on_illegal: random``) so the gibberish model's games reach their end and both
#: seats move in every game.
GAME = ("env_service.env_type=game", "+env_service.create_params.on_illegal=random",
        "data.max_prompt_length=512", "data.max_response_length=320",
        "actor_rollout_ref.rollout.response_length=320", "agent_flow.max_tokens_per_turn=6")
_REPLACED = ("env_service.env_type=lottery",)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("game", tmp_path=tmp_path_factory.mktemp("game_training")) as running:
        yield running.url


def _train(service: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [arg for arg in training_command(service, run_dir, *GAME, *extra) if arg not in _REPLACED]
    return run_training(command, run_dir)


def _advantage(record: dict) -> float:
    """The record's outcome advantage: the value on its policy tokens (GRPO's, one per row)."""
    values = [a for a, m in zip(record["advantages"], record["response_mask"], strict=False) if m]
    assert values and max(values) - min(values) < 1e-5, "an outcome advantage is one number per row"
    return values[0]


def test_two_trained_seats_train_a_step_grouped_per_role(service: str, tmp_path: Path) -> None:
    done = _train(service, tmp_path, "game.trained_seats=[X,O]", "trainer.total_training_steps=1",
                  "trainer.save_freq=-1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    run = tmp_path / "run"
    steps = read_metrics(run / "metrics.jsonl")
    assert sorted(steps) == [1]
    for step, metrics in steps.items():
        records = list(read_rollout_dump(run / "rollouts" / f"step_{step}.jsonl"))
        # 2 tasks x 2 games, each game one row per trained seat
        assert metrics["game/games"] == 4 and metrics["game/seat_rows"] == 8 == len(records)
        assert metrics["train/episode_rows"] == 8 and "timing_s/seat_rows" in metrics
        groups: dict[str, list[dict]] = defaultdict(list)
        for record in records:
            seat = record["seat"]
            assert seat in ("X", "O") and record["group_id"].endswith(f"/{seat}") and record["failure"] is None
            assert sum(record["response_mask"]) > 0
            seat_info = next(s for s in record["game"]["seats"] if s["seat"] == seat)
            assert record["reward"]["outcome"] == seat_info["score"]  # the seat's own score, not the game's
            groups[record["group_id"]].append(record)
        assert len(groups) == 4  # (task, role) groups: 2 tasks x 2 seats
        for members in groups.values():
            assert len(members) == 2 and len({(m["task_id"], m["seat"]) for m in members}) == 1
            scores = [m["reward"]["outcome"] for m in members]
            advantages = [_advantage(m) for m in members]
            assert abs(sum(advantages)) < 1e-4  # normalised within the role's group
            if scores[0] == scores[1]:
                assert advantages == [0.0, 0.0]
            else:
                assert (advantages[0] > advantages[1]) == (scores[0] > scores[1])
        # the two seats of one game are in different groups and carry their own scores
        games = defaultdict(set)
        for record in records:
            games[record["instance_id"]].add(record["seat"])
        assert all(seats == {"X", "O"} for seats in games.values())

    # the viewer shows a game turn by turn, seat by seat
    page = TestClient(create_app(run)).get("/episode", params={"run": ".", "step": 1, "line": 1}).text
    record = next(iter(read_rollout_dump(run / "rollouts" / "step_1.jsonl")))
    assert f"Game (this row: seat {record['seat']})" in page and "(trained)" in page
    assert page.count("<tr><td class=\"num\">") >= len(record["game"]["moves"])


def test_a_failing_opponent_endpoint_fails_its_seat_alone(service: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    done = _train(service, tmp_path, "game.trained_seats=[X]", "+game.opponents.O='endpoint:local'",
                  f"llm.endpoints.local.base_url={dead}", "llm.endpoints.local.max_retries=0",
                  "trainer.total_training_steps=1", "data.train_batch_size=4", "trainer.save_freq=-1")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    run = tmp_path / "run"
    metrics = read_metrics(run / "metrics.jsonl")[1]
    assert metrics["game/games"] == 8 and metrics["game/opponent_failed"] == 8
    assert metrics["episode/failed"] == 0  # the trained seat's rows are not failed
    records = list(read_rollout_dump(run / "rollouts" / "step_1.jsonl"))
    trained = [r for r in records if r.get("seat") == "X"]
    assert trained, "no game let X move before O resigned"
    for record in records:
        seats = {s["seat"]: s for s in record["game"]["seats"]}
        assert seats["O"]["failure"] == "opponent" and "endpoint:local" in seats["O"]["error"]
        # X won by the opponent's resignation (less 0.25 if its one move was illegal and replaced)
        assert seats["X"]["failure"] is None and seats["X"]["score"] >= 0.75 and seats["O"]["score"] == 0.0
    for record in trained:
        assert record["failure"] is None and sum(record["response_mask"]) > 0 and record["group_id"].endswith("/X")
