"""One game through the environment service, every seat asked in turn: shared by training and the arena.

:func:`play_game` creates the instance, reads the seats' openings from ``/get_info``, then asks the seat the
environment names (``info.turn``) for its move and steps it (an assistant message whose ``name`` is the seat)
until the environment says the game is over or ``max_moves`` moves were made, and reads every seat's score.
The environment adjudicates everything, including a failed player: a seat whose player raised
:class:`~agentevolver.module.agent_flow.game_players.PlayerFailed` (or can no longer move) resigns, so the game
ends by its own rules and the failure is recorded against that seat alone. An environment failure (a request
that failed, an instance that was lost) fails the whole game. The instance is released in every outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.module.agent_flow.game_players import PlayerFailed, SeatPlayer, Turn
from agentevolver.schema import ChatMessage

__all__ = ["RESIGN", "GameOutcome", "SeatFailure", "play_game"]

logger = logging.getLogger(__name__)

#: The move a seat makes when its player failed or cannot move (the environment's resignation).
RESIGN = "RESIGN"


@dataclass(frozen=True)
class SeatFailure:
    """Why a seat's player stopped: the service (``opponent``, ``rollout``) and its error."""

    service: str
    error: str


@dataclass
class GameOutcome:
    """What one game produced. ``termination``: ``finished``, ``max_steps`` (``max_moves`` reached) or
    ``env_error`` (then ``error`` says what failed and ``scores`` is empty)."""

    task_id: str
    instance_id: str | None = None
    seats: list[str] = field(default_factory=list)
    players: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    moves: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    failures: dict[str, SeatFailure] = field(default_factory=dict)
    termination: str = "env_error"
    error: str | None = None

    def record(self) -> dict[str, Any]:
        """The game as plain data for the rollout dump, the arena's results and the viewer."""
        return {"task_id": self.task_id, "instance_id": self.instance_id, "seats": list(self.seats),
                "players": dict(self.players), "scores": dict(self.scores), "moves": list(self.moves),
                "summary": dict(self.summary), "termination": self.termination, "error": self.error,
                "failures": {seat: {"service": f.service, "error": f.error} for seat, f in self.failures.items()}}


def _messages(raw: list[Mapping[str, Any]]) -> list[ChatMessage]:
    return [ChatMessage.model_validate(message) for message in raw]


async def play_game(env: EnvClient, env_type: str, task_id: str, *,
                    players: Callable[[str, list[ChatMessage]], SeatPlayer], max_moves: int,
                    params: Mapping[str, Any] | None = None) -> GameOutcome:
    """Play one game (module docstring); ``players(seat, opening)`` builds the player of each seat once the
    environment has said which seats there are. Never raises for environment or player failures."""
    outcome = GameOutcome(task_id=task_id)
    try:
        created = await env.acreate(env_type, task_id, params=dict(params or {}))
        outcome.instance_id = created.info.instance_id
        try:
            await _play(env, outcome, players, max_moves)
        finally:
            await env.arelease(outcome.instance_id)
    except EnvClientError as err:
        outcome.termination, outcome.error = "env_error", f"environment request failed: {err}"
    except KeyError as err:
        outcome.termination, outcome.error = "env_error", f"environment {env_type!r} is not a game (no {err} in info)"
    return outcome


async def _play(env: EnvClient, outcome: GameOutcome, players: Callable[[str, list[ChatMessage]], SeatPlayer],
                max_moves: int) -> None:
    assert outcome.instance_id is not None
    game = (await env.aget_info(outcome.instance_id))["game"]
    outcome.seats = list(game["seats"])
    seated = {seat: players(seat, _messages(game["openings"][seat])) for seat in outcome.seats}
    outcome.players = {seat: player.label for seat, player in seated.items()}
    turn, facts, observation = game["turn"], game, _messages(game["observation"])
    outcome.termination = "max_steps"
    for _ in range(max_moves):
        if turn is None:
            break
        text = await _ask(seated[turn], Turn(turn, observation, list(facts["legal_actions"]), dict(facts["bots"])),
                          outcome)
        step = await env.astep(outcome.instance_id, ChatMessage(role="assistant", content=text, name=turn))
        if step.info.get("fallback"):
            outcome.termination, outcome.error = "env_error", str(step.info.get("error", "environment step failed"))
            return
        facts, turn, observation = step.info["game"], step.info["turn"], list(step.state)
        if step.is_terminated:
            outcome.termination = "finished"
            break
    final = (await env.aget_info(outcome.instance_id))["game"]
    outcome.scores = {seat: float(score) for seat, score in final["scores"].items()}
    outcome.moves, outcome.summary = list(final["moves"]), dict(final.get("summary") or {})


async def _ask(player: SeatPlayer, turn: Turn, outcome: GameOutcome) -> str:
    """The seat's move; ``RESIGN`` (recorded) when its player failed or cannot move."""
    if turn.seat in outcome.failures:
        return RESIGN
    try:
        text = await player.move(turn)
    except PlayerFailed as err:
        outcome.failures[turn.seat] = SeatFailure(err.service, str(err))
        logger.warning("game %s: the player of seat %s (%s) failed and resigns: %s", outcome.task_id, turn.seat,
                       player.label, err)
        return RESIGN
    return RESIGN if text is None else text
