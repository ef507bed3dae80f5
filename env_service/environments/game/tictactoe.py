"""Tic-tac-toe in text, the first game of the ``game`` environment: small enough for SmolLM2-135M.

Cells are numbered 1-9 and an empty cell shows its number on the board, so a legal move is a number the
seat can copy from what it sees. A seat answers ``MOVE: <n>``; the first digit 1-9 of its text is read when
the ``MOVE:`` form is missing (a small model drifts from the format; the game judges the move, not the
wording). An occupied or unreadable cell is illegal: the seat is told why and may try again
(``params.illegal_retries``, default 1), after that it forfeits. ``RESIGN`` forfeits at once (the episode
source sends it for a seat whose player failed).

Scores: a win 1, a draw 0.5, a loss or a forfeit 0. Tasks are openings: 0-2 moves already on the board,
drawn from a seed per task id, so the same task id is the same position for every seat and every rollout
(GRPO's group) and the two seats of one task play different roles in it. ``bots`` offers ``perfect``
(minimax: never loses) for scripted opponents and the arena.
"""

from __future__ import annotations

import random
import re
from functools import cache
from typing import Any, ClassVar

from agentevolver.schema import ChatMessage
from env_service.environments.game.rules import GAMES, GameRules, Illegal
from env_service.errors import EnvServiceError

__all__ = ["TicTacToe"]

SEATS = ("X", "O")
LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
_MOVE = re.compile(r"MOVE\s*:?\s*([1-9])", re.IGNORECASE)
_DIGIT = re.compile(r"(?<!\d)([1-9])(?!\d)")

SYSTEM_PROMPT = (
    "You play tic-tac-toe as {seat}; your opponent plays {other}. The cells are numbered 1 to 9, and a cell "
    "that still shows its number is empty. On your turn, reply with MOVE: <number of an empty cell>. Three of "
    "your marks in a row, column or diagonal win."
)

#: Worked turns (board, move) shown to every seat before its first real turn, as real prior turns: the
#: 135M model copies the MOVE form and picks a shown number far more often with them (docs/env_games.md).
_DEMOS: tuple[tuple[str, str], ...] = (
    ("X..|.O.|...", "MOVE: 3"),
    ("XO.|.X.|..O", "MOVE: 7"),
)


def board_text(cells: list[str]) -> str:
    """The board as three rows, an empty cell showing its number."""
    shown = [cell if cell != "." else str(index + 1) for index, cell in enumerate(cells)]
    rows = [" " + " | ".join(shown[row * 3: row * 3 + 3]) for row in range(3)]
    return "\n---+---+---\n".join(rows)


def winner(cells: tuple[str, ...] | list[str]) -> str | None:
    """``X`` or ``O`` when that seat has three in a row, else None."""
    for a, b, c in LINES:
        if cells[a] != "." and cells[a] == cells[b] == cells[c]:
            return cells[a]
    return None


@cache
def _value(cells: tuple[str, ...], seat: str) -> int:
    """Minimax value for ``seat`` to move: 1 win, 0 draw, -1 loss."""
    won = winner(cells)
    if won is not None:
        return 1 if won == seat else -1
    empty = [i for i, cell in enumerate(cells) if cell == "."]
    if not empty:
        return 0
    other = "O" if seat == "X" else "X"
    return max(-_value((*cells[:i], seat, *cells[i + 1:]), other) for i in empty)


def perfect_move(cells: list[str], seat: str) -> int:
    """The lowest-numbered cell with the best minimax value (deterministic, so the arena is repeatable)."""
    other = "O" if seat == "X" else "X"
    state = tuple(cells)
    empty = [i for i, cell in enumerate(cells) if cell == "."]
    return max(empty, key=lambda i: (-_value((*state[:i], seat, *state[i + 1:]), other), -i))


def _demos_param(params: dict[str, Any]) -> int:
    """``params.demos``: true (all), false (none) or a count; an error naming the field otherwise."""
    demos = params.get("demos", len(_DEMOS))
    if isinstance(demos, bool):
        demos = len(_DEMOS) if demos else 0
    if not isinstance(demos, int) or demos < 0:
        raise EnvServiceError(f"params.demos must be true, false or a count >= 0 of demonstrations (at most "
                              f"{len(_DEMOS)} are shown), got {demos!r}", field="params.demos")
    return demos


@GAMES.register("tictactoe")
class TicTacToe(GameRules):
    """One game of tic-tac-toe (module docstring)."""

    split_sizes: ClassVar[dict[str, int]] = {"train": 64, "val": 16, "test": 16}
    _SPLIT_SEEDS: ClassVar[dict[str, int]] = {"train": 1000, "val": 2000, "test": 3000}

    def __init__(self, cells: list[str], first: str, demos: int = len(_DEMOS)) -> None:
        self.cells = cells
        self.turn: str | None = first
        self.demos = demos
        self.result: dict[str, float] | None = None
        self.forfeited: str | None = None

    @classmethod
    def from_task(cls, split: str, index: int, params: dict[str, Any]) -> TicTacToe:
        demos = _demos_param(params)
        rng = random.Random(cls._SPLIT_SEEDS[split] + index)
        cells, seat = ["."] * 9, "X"
        for _ in range(rng.choice((0, 1, 1, 2, 2))):  # a move or two already played; never a decided board
            cells[rng.choice([i for i, cell in enumerate(cells) if cell == "."])] = seat
            seat = "O" if seat == "X" else "X"
        return cls(cells, seat, demos)

    @classmethod
    def fresh(cls, params: dict[str, Any]) -> TicTacToe:
        """The empty board, X to move."""
        return cls(["."] * 9, SEATS[0], _demos_param(params))

    def seats(self) -> list[str]:
        return list(SEATS)

    def opening(self, seat: str) -> list[ChatMessage]:
        other = "O" if seat == "X" else "X"
        messages = [ChatMessage(role="system", content=SYSTEM_PROMPT.format(seat=seat, other=other))]
        for rows, move in _DEMOS[: self.demos]:
            cells = list(rows.replace("|", ""))
            if seat == "O":  # the seat's own marks are its letter in its demonstrations too
                cells = [{"X": "O", "O": "X"}.get(c, c) for c in cells]
            messages += [ChatMessage(role="user", content=self._prompt(cells, seat)),
                         ChatMessage(role="assistant", content=move)]
        return messages

    @staticmethod
    def _prompt(cells: list[str], seat: str) -> str:
        return f"Board:\n{board_text(cells)}\nYou are {seat}. Your move."

    def to_move(self) -> str | None:
        return self.turn

    def observation(self, seat: str) -> list[ChatMessage]:
        return [ChatMessage(role="user", content=self._prompt(self.cells, seat))]

    def legal_actions(self, seat: str) -> list[str]:
        return [f"MOVE: {i + 1}" for i, cell in enumerate(self.cells) if cell == "."]

    def apply(self, seat: str, text: str) -> Illegal | None:
        found = _MOVE.search(text or "") or _DIGIT.search(text or "")
        if found is None:
            return Illegal("no cell number found; reply with MOVE: <number of an empty cell>")
        cell = int(found.group(1)) - 1
        if self.cells[cell] != ".":
            return Illegal(f"cell {cell + 1} is taken; pick a cell that still shows its number")
        self.cells[cell] = seat
        won = winner(self.cells)
        if won is not None:
            self.result = {s: 1.0 if s == won else 0.0 for s in SEATS}
        elif "." not in self.cells:
            self.result = {s: 0.5 for s in SEATS}
        self.turn = None if self.result is not None else ("O" if seat == "X" else "X")
        return None

    def forfeit(self, seat: str) -> None:
        self.forfeited = seat
        self.result = {s: 0.0 if s == seat else 1.0 for s in SEATS}
        self.turn = None

    def scores(self) -> dict[str, float]:
        return dict(self.result) if self.result is not None else {s: 0.5 for s in SEATS}

    def bots(self, seat: str) -> dict[str, str]:
        return {"perfect": f"MOVE: {perfect_move(self.cells, seat) + 1}"}

    def outcome(self) -> str:
        won = winner(self.cells)
        if self.forfeited is not None:
            how = f"{self.forfeited} forfeited"
        else:
            how = f"{won} wins with three in a row" if won else "a draw: the board is full"
        return f"The game is over: {how}.\nBoard:\n{board_text(self.cells)}"

    def summary(self) -> dict[str, Any]:
        won = winner(self.cells)
        return {"board": "".join(self.cells), "winner": won, "forfeited": self.forfeited,
                "draw": self.result is not None and won is None and self.forfeited is None}
