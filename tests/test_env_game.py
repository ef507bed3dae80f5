"""The ``game`` environment through the real env service, and whole games between scripted and endpoint players
(:func:`agentevolver.module.agent_flow.game_loop.play_game`); no model is trained here."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from env_service_fixture import env_service, quick_env_client
from ports import free_port

from agentevolver.client.llm_client import LLMClient
from agentevolver.client.llm_config import LLMEndpointConfig
from agentevolver.module.agent_flow.game_loop import play_game
from agentevolver.module.agent_flow.game_players import EndpointPlayer, ScriptedPlayer
from env_service.environments.game import GameEnv
from env_service.environments.game.tictactoe import perfect_move, winner


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("game", tmp_path=tmp_path_factory.mktemp("game")) as running:
        yield running.url


def _post(url: str, route: str, **body: object) -> dict:
    return httpx.post(f"{url}{route}", json=body, timeout=30).json()


def _create(url: str, task_id: str = "tictactoe-train-000", **params: object) -> tuple[str, dict]:
    created = _post(url, "/create", env_type="game", task_id=task_id, params={"shape": "native", **params})
    assert created["success"], created
    instance = created["data"]["info"]["instance_id"]
    return instance, _post(url, "/get_info", instance_id=instance)["data"]["game"]


def _move(url: str, instance: str, seat: str, text: str) -> dict:
    return _post(url, "/step", instance_id=instance, messages={"role": "assistant", "content": text, "name": seat},
                 params={"shape": "native"})


def test_tasks_are_openings_that_are_still_open() -> None:
    ids = GameEnv.task_ids("train")
    assert len(ids) == 64 and GameEnv.task_ids("val/tictactoe") == GameEnv.task_ids("val")
    assert not set(ids) & set(GameEnv.task_ids("val"))
    for task_id in ids:
        game = GameEnv(task_id, "i", {}).game
        assert game.to_move() in ("X", "O") and winner(game.cells) is None and game.cells.count(".") >= 7


def test_the_service_says_whose_turn_it_is_and_refuses_the_wrong_seat(service: str) -> None:
    instance, game = _create(service)
    assert game["seats"] == ["X", "O"] and not game["over"]
    turn = game["turn"]
    other = "O" if turn == "X" else "X"
    assert set(game["openings"]) == {"X", "O"} and "MOVE:" in game["openings"][turn][0]["content"]
    wrong = _move(service, instance, other, "MOVE: 5")
    assert not wrong["success"] and wrong["error"]["field"] == "messages.name", wrong
    legal = game["legal_actions"][0]
    done = _move(service, instance, turn, legal)["data"]
    assert done["info"]["turn"] == other and not done["is_terminated"]
    assert f"You are {other}" in done["state"][0]["content"]


def test_an_illegal_move_is_explained_then_forfeits(service: str) -> None:
    instance, game = _create(service, illegal_retries=1)
    turn = game["turn"]
    first = _move(service, instance, turn, "I like turtles")["data"]
    assert first["info"]["turn"] == turn and first["info"]["illegal"].startswith("no cell number")
    assert first["state"][0]["content"].startswith("Illegal move")
    second = _move(service, instance, turn, "no idea")["data"]
    assert second["is_terminated"]
    assert second["info"]["game"]["scores"] == {turn: 0.0, ("O" if turn == "X" else "X"): 1.0}


def test_on_illegal_random_plays_on_and_charges_the_seat(service: str) -> None:
    instance, game = _create(service, on_illegal="random", illegal_penalty=0.25)
    turn = game["turn"]
    step = _move(service, instance, turn, "hmm")["data"]
    assert step["info"]["turn"] != turn and step["info"]["game"]["moves"][0]["replaced_by"].startswith("MOVE:")


def test_evaluate_scores_the_requested_seat(service: str) -> None:
    instance, game = _create(service, "tictactoe-val-003", seat="O")
    turn = game["turn"]
    _move(service, instance, turn, "RESIGN")
    score = _post(service, "/evaluate", instance_id=instance, params={"sparse": False})["data"]
    assert score == (1.0 if turn == "X" else 0.0)


def test_a_bad_param_names_its_field(service: str) -> None:
    answer = _post(service, "/create", env_type="game", task_id="tictactoe-train-000",
                   params={"on_illegal": "ignore"})
    assert not answer["success"] and answer["error"]["field"] == "params.on_illegal"
    answer = _post(service, "/create", env_type="game", task_id="chess-train-000", params={})
    assert not answer["success"] and answer["error"]["field"] == "task_id"


def test_perfect_never_loses_to_random() -> None:
    rng = random.Random(0)
    for _ in range(40):
        cells, seat = ["."] * 9, rng.choice("XO")
        while winner(cells) is None and "." in cells:
            if seat == "X":
                cells[perfect_move(cells, "X")] = "X"
            else:
                cells[rng.choice([i for i, c in enumerate(cells) if c == "."])] = "O"
            seat = "O" if seat == "X" else "X"
        assert winner(cells) != "O"


def _scripted(names: dict[str, str], seed: int = 0):
    rng = random.Random(seed)
    return lambda seat, opening: ScriptedPlayer(names[seat], opening, rng)


def test_scripted_players_play_whole_games(service: str) -> None:
    async def games() -> list:
        async with quick_env_client(service) as env:
            return [await play_game(env, "game", f"tictactoe-val-{i:03d}", players=_scripted({"X": "perfect", "O": "random"}, i),
                                    max_moves=20) for i in range(6)]

    for outcome in asyncio.run(games()):
        assert outcome.termination == "finished" and outcome.scores["X"] >= 0.5, outcome.record()
        assert outcome.players == {"X": "scripted:perfect", "O": "scripted:random"} and not outcome.failures


def test_a_failing_endpoint_resigns_its_seat_alone(service: str) -> None:
    dead = LLMEndpointConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="nobody", max_retries=0,
                             timeout_s=5.0)
    client = LLMClient(dead, name="dead")

    def players(seat: str, opening: list):
        if seat == "O":
            return EndpointPlayer(client, opening, temperature=0.0, max_tokens=8)
        return ScriptedPlayer("first", opening, random.Random(0))

    async def game():
        async with quick_env_client(service) as env:
            return await play_game(env, "game", "tictactoe-train-000", players=players, max_moves=20)

    outcome = asyncio.run(game())
    assert set(outcome.failures) == {"O"} and outcome.failures["O"].service == "opponent"
    assert outcome.termination == "finished" and outcome.scores == {"X": 1.0, "O": 0.0}
    assert outcome.moves[-1] == {"seat": "O", "text": "RESIGN", "legal": True, "resigned": True}


def test_the_game_record_is_plain_data(tmp_path: Path, service: str) -> None:
    import json

    async def game():
        async with quick_env_client(service) as env:
            return await play_game(env, "game", "tictactoe-test-001", players=_scripted({"X": "random", "O": "first"}),
                                   max_moves=20)

    record = asyncio.run(game()).record()
    (tmp_path / "g.json").write_text(json.dumps(record))
    assert record["summary"]["board"] and record["moves"]
