"""The adapter shape of a game: what :class:`~env_service.environments.game.GameEnv` needs from one game's rules.

A game is a :class:`GameRules` subclass registered in :data:`GAMES` under the name its task ids start with
(``tictactoe-train-007`` -> ``tictactoe``). The environment owns the state and the turn order; the rules only
answer questions about it. Nothing here knows about models: every seat, trained or not, speaks text.

To add a larger game (Avalon, Diplomacy) write one module with a subclass and register it:

* ``fresh(params)`` a new game from the start, no move played (what the exploration seed ``explore-<game>`` plays);
* ``seats()`` the roles in seat order (Avalon: ``["merlin", "percival", "servant1", ..., "assassin"]``);
* ``opening(seat)`` the seat's private opening (system prompt with its secret role, demonstrations);
* ``to_move()`` whose turn it is, ``observation(seat)`` what that seat sees now (only its own information:
  hidden roles stay hidden), ``legal_actions(seat)`` the actions a scripted player may choose from (as text,
  exactly as a model would write them; may be a sample of a large space);
* ``apply(seat, text)`` reads the seat's text and advances the state, or returns an :class:`Illegal` that
  explains why (the environment nudges the seat, and after ``params.illegal_retries`` it forfeits);
* ``forfeit(seat)`` ends the game with that seat losing; ``scores()`` one number per seat in [0, 1] once the
  game is over (Avalon: 1 for every member of the winning team); ``bots(seat)`` optional named scripted
  moves the game itself knows how to make (``{"perfect": "MOVE: 5"}``); ``outcome()`` optional, how the game
  ended in words (the last step's observation, so a record of the game says who won).

Simultaneous moves (Diplomacy's orders) fit the same shape: ``to_move`` names one seat at a time and
``apply`` buffers its orders until the last seat of the phase has written, then resolves the phase.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from agentevolver.registry import Registry
from agentevolver.schema import ChatMessage

__all__ = ["GAMES", "GameRules", "Illegal"]


@dataclass(frozen=True)
class Illegal:
    """Why a seat's text is not a legal move (shown to the seat, which may try again)."""

    reason: str


class GameRules(ABC):
    """One game in progress (module docstring): built from a task id's seed by :meth:`from_task`."""

    #: Task ids per split (ids look like ``<game>-<split>-<nnn>``).
    split_sizes: ClassVar[dict[str, int]] = {}

    @classmethod
    @abstractmethod
    def from_task(cls, split: str, index: int, params: dict[str, Any]) -> GameRules:
        """The game of one task (its opening position and seat order come from ``(split, index)``)."""

    @classmethod
    @abstractmethod
    def fresh(cls, params: dict[str, Any]) -> GameRules:
        """A new game from the starting position, no move played: what the game's exploration seed plays."""

    @abstractmethod
    def seats(self) -> list[str]:
        """The seats in order (also the order ``scores`` lists them in)."""

    @abstractmethod
    def opening(self, seat: str) -> list[ChatMessage]:
        """What ``seat`` is told once, before its first observation: rules, its role, demonstrations."""

    @abstractmethod
    def to_move(self) -> str | None:
        """The seat whose turn it is; None once the game is over."""

    @abstractmethod
    def observation(self, seat: str) -> list[ChatMessage]:
        """What ``seat`` sees before its move (its own view of the state only)."""

    @abstractmethod
    def legal_actions(self, seat: str) -> list[str]:
        """Legal moves of ``seat`` as text, for scripted players."""

    @abstractmethod
    def apply(self, seat: str, text: str) -> Illegal | None:
        """Play ``seat``'s move written as ``text``; an :class:`Illegal` leaves the state unchanged."""

    @abstractmethod
    def forfeit(self, seat: str) -> None:
        """End the game now, ``seat`` losing (it resigned, failed, or kept making illegal moves)."""

    @abstractmethod
    def scores(self) -> dict[str, float]:
        """Each seat's score in [0, 1]; meaningful once :meth:`to_move` is None."""

    def bots(self, seat: str) -> dict[str, str]:
        """Named scripted moves this game can make for ``seat`` now (none by default)."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Game-specific facts for the record (e.g. the winner, the final board)."""
        return {}

    def outcome(self) -> str:
        """How the finished game ended, in words (the environment adds every seat's score)."""
        return "The game is over."


#: game name -> rules class.
GAMES: Registry[type[GameRules]] = Registry("game", "task_id", hint="a game task id is '<game>-<split>-<n>'")
