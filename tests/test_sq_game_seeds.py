"""Self-Questioning explores a multi-seat environment from its exploration seed: game's ``explore-tictactoe``.

A game's ``/step`` takes a move only from the seat whose turn it is (``name``), and after X moves the game
shows O's view; the explorer (:class:`~agentevolver.module.task_manager.exploration.Seating`) reads the seats
from ``/get_info`` and, at every step, is told which seat it plays and acts in that seat's own view. Before,
the first ``/step`` was rejected (``messages.name``) and no exploration of a game ever finished.

The explorer is the scripted OpenAI-compatible server: it reads which seat it was told to play and the board
that seat was shown last, and plays a free cell of it (drawn with the request's seed, so the games differ).
End to end through ``python -m agentevolver.module.task_manager`` on the real env service (``game`` and, for
the single-seat check, ``calc``) with a scripted LLM task writer and feasibility judge; then the strategy's
API for the ``max_explore_step`` bound, an illegal move (the turn comes from the environment, not from
alternating) and calc explored exactly as before seats existed (the explorer's view is the whole record).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import REPO_ROOT, env_service
from scripted_openai_server import Reply, ScriptedOpenAIServer

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClients
from agentevolver.config import load_config
from agentevolver.module.task_manager import read_objectives
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.exploration import RandomWalk, Seating
from agentevolver.module.task_manager.prompts import FILTER_SYSTEM, SUMMARIZER_SYSTEM
from agentevolver.module.task_manager.transcript import for_chat_server, render_transcript
from agentevolver.schema import ChatMessage, Task, Trajectory
from env_service.environments.game.tictactoe import TicTacToe

SEED = "explore-tictactoe"
EXPLORING = "You are now EXPLORING this environment"
_TOLD = re.compile(r"It is now seat (\w+)'s turn")
_SYSTEM_SEAT = re.compile(r"You play tic-tac-toe as (\w+);")
_BOARD = re.compile(r"Board:\n(.*?)\nYou are (\w+)\. Your move\.", re.S)
_MOVE = re.compile(r"\[agent as (\w+)\]\nMOVE: (\d)")


@dataclass(frozen=True)
class Turn:
    """One explorer request of a game: the seat it was told to play, the seat of its system prompt and of the
    board it was shown, the free cells of that board, and the move it made."""

    told: str | None
    system_seat: str | None
    board_seat: str | None
    free: tuple[int, ...]
    move: int
    seed_question: bool


@dataclass
class GameRoles:
    """The scripted LLM roles: an explorer playing a free cell for the seat it is told to play (or, once, the
    cell ``illegal_once`` names, taken or not), a task writer writing two tasks an exploration and a judge
    accepting every task."""

    illegal_once: int | None = None
    turns: list[Turn] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)

    def __call__(self, body: dict[str, Any]) -> Reply | str:
        system = body["messages"][0]["content"]
        if system.startswith(SUMMARIZER_SYSTEM):
            self.calls["writer"] += 1
            n = self.calls["writer"]
            return json.dumps({"tasks": [
                {"query": f"Playing O, block X's row after X took cells {n} and {n + 1}.", "answer": "MOVE: 3",
                 "confidence": 0.6},
                {"query": f"As X, win tic-tac-toe in three moves when O opens in the corner (game {n}).",
                 "answer": "three in a row", "confidence": 0.5}]})
        if system.startswith(FILTER_SYSTEM):
            self.calls["judge"] += 1
            return '{"feasible": true, "reason": "the game takes these moves"}'
        if EXPLORING not in system:
            return Reply.error(418, f"unexpected role: {system[:80]!r}")
        self.calls["explorer"] += 1
        return f"MOVE: {self._move(body, system)}"

    def _move(self, body: dict[str, Any], system: str) -> int:
        last = body["messages"][-1]["content"]  # what the seat to move was shown last
        board = _BOARD.search(last)
        cells = re.findall(r"[1-9XO]", board.group(1)) if board else []
        free = tuple(int(cell) for cell in cells if cell.isdigit())
        told, system_seat = _TOLD.search(system), _SYSTEM_SEAT.search(system)
        if self.illegal_once is not None and told and told.group(1) == "O":
            move, self.illegal_once = self.illegal_once, None
        else:
            move = random.Random(body["seed"]).choice(free) if free else 5
        self.turns.append(Turn(told.group(1) if told else None, system_seat.group(1) if system_seat else None,
                               board.group(2) if board else None, free, move,
                               "exploration seed, not a task" in system))
        return move


def _games(turns: list[Turn]) -> list[list[Turn]]:
    """The turns split into games: a game starts on the empty board."""
    games: list[list[Turn]] = []
    for turn in turns:
        if len(turn.free) == 9 and turn.told == "X":
            games.append([])
        games[-1].append(turn)
    return games


def _replay(game: list[Turn]) -> TicTacToe:
    """The moves played again by the game's rules: each must be legal for the seat that made it."""
    board = TicTacToe.fresh({})
    for turn in game:
        assert board.to_move() == turn.told, (turn, board.cells)
        assert board.apply(turn.told, f"MOVE: {turn.move}") is None, (turn, board.cells)
    return board


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real env service serving game (multi-seat) and calc (single-seat)."""
    with env_service("game,calc", tmp_path=tmp_path_factory.mktemp("sq_game")) as running:
        yield running.url


def _overrides(service: str, scripted: ScriptedOpenAIServer, out: Path, *extra: str) -> list[str]:
    return [f"env_service.env_url={service}", "env_service.max_retries=0", "env_service.env_type=game",
            "task_manager.seed_split=explore", "task_manager.writer=llm",
            f"llm.endpoints.local.base_url={scripted.base_url}", "llm.endpoints.local.max_retries=0",
            "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
            f"task_manager.synthetic_tasks_path={out / 'tasks.jsonl'}",
            f"task_manager.checkpoint_path={out / 'checkpoint.json'}", "task_manager.num_explore_threads=1",
            *extra]


def _explore(service: str, scripted: ScriptedOpenAIServer, tmp_path: Path, seed: str, *extra: str) -> Trajectory:
    """One exploration of ``seed`` through the strategy's API (the TaskManager's dependencies, real clients)."""
    _cfg, settings = load_config(_overrides(service, scripted, tmp_path, *extra))
    with EnvClient.from_config(settings.env_service) as env, LLMClients(settings.llm) as llm:
        walk = RandomWalk(TaskManagerDeps(settings, env=env, llm=llm))
        return walk.explore(Task(task_id=seed, env_type=settings.env_service.env_type), 0)


# ---------------------------------------------------------------------------------------------- end to end
def test_cli_explores_the_game_seed_playing_both_seats_and_writes_tasks(
        service: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = GameRoles()
    scripted_llm.respond_with(roles)
    args = ["--no-progress", "--summary-json", str(tmp_path / "summary.json"),
            *_overrides(service, scripted_llm, tmp_path, "task_manager.n=2", "task_manager.max_explore_step=9")]
    result = subprocess.run([sys.executable, "-m", "agentevolver.module.task_manager", *args], cwd=REPO_ROOT,
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stderr + result.stdout

    # every step: the explorer was told the seat to move and shown that seat's own view (its system prompt
    # with the seed's question, its board), and played a legal move for it; both seats moved in both games
    games = _games(roles.turns)
    assert len(games) == 2
    for game in games:
        assert all(t.told == t.system_seat == t.board_seat and t.seed_question for t in game), game
        assert [t.told for t in game] == ["X", "O"] * (len(game) // 2) + ["X"] * (len(game) % 2)
        assert {t.told for t in game} == {"X", "O"} and all(t.move in t.free for t in game)
        assert _replay(game).to_move() is None  # the game was played to its end (within 9 moves)

    summary = json.loads((tmp_path / "summary.json").read_text())
    counts = summary["counts"]
    assert (counts["explorations_run"], counts["explore_steps"]) == (2, len(roles.turns)) and not summary["failures"]

    # the task writer read each game as one coherent record: the moves by seat in the order they were made
    records = [b["messages"][-1]["content"] for b in scripted_llm.bodies
               if b["messages"][0]["content"].startswith(SUMMARIZER_SYSTEM)]
    assert len(records) == 2 and roles.calls["writer"] == 2
    for record, game in zip(records, games, strict=True):
        assert _MOVE.findall(record) == [(t.told, str(t.move)) for t in game]
        assert "Illegal move" not in record and "You are O. Your move." in record
        assert "The game is over:" in record.rsplit("[agent as", 1)[1]  # the last move's answer: who won

    written = read_objectives(tmp_path / "tasks.jsonl")
    assert written and len(written) == counts["tasks_written"] and roles.calls["judge"] >= len(written)
    assert all(o.seed_task_id == SEED and o.task.env_type == "game" and o.source == "synthetic" for o in written)


# ---------------------------------------------------------------------------------------------- the strategy
def test_an_exploration_stops_at_max_explore_step_with_both_seats_moved(
        service: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = GameRoles()
    scripted_llm.respond_with(roles)
    trajectory = _explore(service, scripted_llm, tmp_path, SEED, "task_manager.max_explore_step=3")
    assert (trajectory.num_steps, trajectory.termination_reason) == (3, "max_steps")
    assert trajectory.metadata["seats"] == ["X", "O"]
    steps = trajectory.messages[trajectory.metadata["opening_len"]:]
    assert [(m.role, m.name) for m in steps] == [("assistant", "X"), ("user", None), ("assistant", "O"),
                                                  ("user", None), ("assistant", "X"), ("user", None)]
    assert [t.told for t in roles.turns] == ["X", "O", "X"] and _replay(roles.turns).to_move() == "O"
    assert "You are O. Your move." in steps[1].content and "You are X. Your move." in steps[3].content


def test_the_seat_to_move_comes_from_the_environment_after_an_illegal_move(
        service: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    roles = GameRoles(illegal_once=0)  # O's first move: cell 0, which is no cell
    scripted_llm.respond_with(roles)
    trajectory = _explore(service, scripted_llm, tmp_path, SEED, "task_manager.max_explore_step=4")
    assert [t.told for t in roles.turns] == ["X", "O", "O", "X"]  # O again, told why
    assert [m.name for m in trajectory.messages if m.role == "assistant"][-4:] == ["X", "O", "O", "X"]
    retry = trajectory.messages[trajectory.metadata["opening_len"] + 3]
    assert retry.role == "user" and retry.content.startswith("Illegal move:") and "You are O" in retry.content
    assert "Illegal move:" in render_transcript(trajectory.messages, 2000)


def test_a_single_seat_environment_is_explored_as_before(
        service: str, scripted_llm: ScriptedOpenAIServer, tmp_path: Path) -> None:
    """calc: no seat is named, no move carries a name, and the explorer's view at step k is the whole record
    so far (the opening and every earlier step), as it was before seats existed."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    scripted_llm.respond_with(lambda body: call if EXPLORING in body["messages"][0]["content"] else Reply.error(418))
    trajectory = _explore(service, scripted_llm, tmp_path, "explore-calculator", "env_service.env_type=calc",
                          "task_manager.max_explore_step=2")
    assert (trajectory.num_steps, trajectory.termination_reason) == (2, "max_steps")
    assert "seats" not in trajectory.metadata
    assert all(m.name is None for m in trajectory.messages if m.role == "assistant")
    bodies = scripted_llm.bodies
    assert len(bodies) == 2
    opening_len = trajectory.metadata["opening_len"]
    for step, body in enumerate(bodies):
        seen = for_chat_server(trajectory.messages[:opening_len + 2 * step], 2000, tagged_calls=True)
        assert body["messages"][1:] == seen[1:]
        assert body["messages"][0]["content"].startswith(seen[0]["content"] + "\n\n" + EXPLORING)
        assert "It is now seat" not in body["messages"][0]["content"]
    assert trajectory.messages[opening_len + 1].content.strip() == "42"
    assert "[agent]" in render_transcript(trajectory.messages, 2000)
    assert "agent as" not in render_transcript(trajectory.messages, 2000)


def test_seating_reads_seats_only_from_an_answer_that_names_the_seat_to_move() -> None:
    opening = [ChatMessage(role="system", content="rules for X"), ChatMessage(role="user", content="X, move")]
    o_opening = [{"role": "system", "content": "rules for O"}]
    for info in ({}, {"turn": "X"}, {"seats": ["X", "O"], "turn": None}, {"seats": ["X", "O"], "turn": "Z"},
                 {"seats": "XO", "turn": "X"}, {"turn_index": 0, "tools": []}):
        single = Seating.from_info(info, opening)
        assert (single.turn, single.seats, single.view()) == (None, [], opening), info
    seated = Seating.from_info({"seats": ["X", "O"], "turn": "X", "openings": {"O": o_opening}}, opening)
    assert (seated.turn, seated.seats, seated.view()) == ("X", ["X", "O"], opening)
    move = ChatMessage(role="assistant", content="MOVE: 5", name="X")
    seated.advance(move, [ChatMessage(role="user", content="O, move")], "O")
    assert seated.turn == "O" and [m.content for m in seated.view()] == ["rules for O", "O, move"]
    assert seated.views["X"][-1] == move
