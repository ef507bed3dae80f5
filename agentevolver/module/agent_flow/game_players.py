"""Who plays a seat of a game that is not the policy being trained: scripted players and OpenAI-compatible
endpoints (docs/env_games.md). The trained policy's seats are played by the game episode source itself,
token in / token out (:mod:`agentevolver.module.agent_flow.game`); the arena adds checkpoints
(:mod:`agentevolver.arena.players`).

A player is asked for one move at a time with a :class:`Turn` (what the seat sees now, the legal moves and
the game's own bots) and answers with the move's text. A player that cannot answer raises
:class:`PlayerFailed` naming the service: the game loop then resigns its seat, so the failure is that seat's
alone (:mod:`agentevolver.module.agent_flow.game_loop`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentevolver.config.game import parse_player
from agentevolver.errors import ConfigError
from agentevolver.schema import ChatMessage

__all__ = ["EndpointPlayer", "PlayerFailed", "ScriptedPlayer", "SeatPlayer", "TextSeat", "Turn", "make_player"]

#: Generic scripted players; any other scripted name must be a bot the game offers (``Turn.bots``).
GENERIC_SCRIPTED = ("random", "first", "pass")


@dataclass(frozen=True)
class Turn:
    """One request for a move: the seat, what it sees now (new messages since its last move, or its opening
    and first observation), and, for scripted players, the legal moves and the game's named bots."""

    seat: str
    observation: list[ChatMessage]
    legal_actions: list[str] = field(default_factory=list)
    bots: Mapping[str, str] = field(default_factory=dict)


class PlayerFailed(Exception):
    """A player could not produce a move; ``service`` names what failed (``opponent``, ``rollout``)."""

    def __init__(self, service: str, message: str) -> None:
        super().__init__(message)
        self.service = service


class SeatPlayer(Protocol):
    """Plays one seat of one game. ``label`` names it in records (``policy``, ``scripted:random``, ...)."""

    label: str

    async def move(self, turn: Turn) -> str | None:
        """The move's text; None = the player cannot move any more (its token budget is spent): it resigns."""
        ...


class TextSeat:
    """A seat whose player reads and writes text: keeps the seat's conversation (opening, observations, its own
    moves) so an LLM player sees the whole game from its seat, and the record shows it."""

    label = "text"

    def __init__(self, opening: list[ChatMessage]) -> None:
        self.messages: list[ChatMessage] = list(opening)

    async def move(self, turn: Turn) -> str | None:
        self.messages += turn.observation
        text = await self.reply(turn)
        self.messages.append(ChatMessage(role="assistant", content=text))
        return text

    async def reply(self, turn: Turn) -> str:
        raise NotImplementedError


class ScriptedPlayer(TextSeat):
    """``random`` (a seeded choice among the legal moves), ``first`` (the first legal move), ``pass`` (always an
    illegal ``PASS``: a player that never plays, for tests and as the arena's floor) or a bot the game offers
    by name (tic-tac-toe: ``perfect``)."""

    def __init__(self, name: str, opening: list[ChatMessage], rng: random.Random) -> None:
        super().__init__(opening)
        self.name = name
        self.label = f"scripted:{name}"
        self.rng = rng

    async def reply(self, turn: Turn) -> str:
        if self.name == "pass":
            return "PASS"
        if self.name in turn.bots:
            return turn.bots[self.name]
        if self.name not in GENERIC_SCRIPTED:
            raise ConfigError(f"game.opponents: scripted player {self.name!r} is neither generic "
                              f"({', '.join(GENERIC_SCRIPTED)}) nor a bot this game offers "
                              f"({', '.join(turn.bots) or 'none'})")
        if not turn.legal_actions:
            raise PlayerFailed("opponent", "the game lists no legal move for a scripted player")
        return turn.legal_actions[0] if self.name == "first" else self.rng.choice(turn.legal_actions)


class EndpointPlayer(TextSeat):
    """An OpenAI-compatible endpoint (``llm.endpoints.<name>``: a hosted model, vLLM, a served checkpoint)
    answering from the seat's conversation; any error after the client's retries fails the seat."""

    def __init__(self, client: Any, opening: list[ChatMessage], *, temperature: float, max_tokens: int) -> None:
        super().__init__(opening)
        self.client = client
        self.label = f"endpoint:{client.name}"
        self.temperature = temperature
        self.max_tokens = max_tokens

    async def reply(self, turn: Turn) -> str:
        messages = [message.model_dump(exclude_none=True) for message in self.messages]
        try:
            result = await self.client.achat(messages, temperature=self.temperature, max_tokens=self.max_tokens)
        except Exception as err:  # LLMError after retries, or anything the SDK raised: the seat's failure
            raise PlayerFailed("opponent", f"{self.label}: {type(err).__name__}: {err}") from err
        return result.text


def make_player(spec: str, opening: list[ChatMessage], *, clients: Mapping[str, Any], rng: random.Random,
                temperature: float, max_tokens: int) -> TextSeat:
    """The player ``spec`` (``scripted:<name>`` or ``endpoint:<name>``) for one seat of one game; ``clients``
    holds one LLM client per endpoint name, shared by the games of a process."""
    kind, name = parse_player(spec)
    if kind == "scripted":
        return ScriptedPlayer(name, opening, rng)
    if name not in clients:
        raise ConfigError(f"game.opponents: endpoint {name!r} is not under llm.endpoints")
    return EndpointPlayer(clients[name], opening, temperature=temperature, max_tokens=max_tokens)
