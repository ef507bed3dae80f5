"""Rounds of an arena: every pair of players meets on every task, once in each seat order.

Seats are assigned fairly: for a pair (a, b) and a task, one game has a in the first seat and b in the second,
the other the reverse, so a first-mover advantage (tic-tac-toe's X) and an opening that favours one side cancel
out over the pair. Each game is played through the environment service by
:func:`~agentevolver.module.agent_flow.game_loop.play_game` and appended to the results file as soon as it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from agentevolver.arena.players import PlayerFactory, PlayerSpec
from agentevolver.arena.results import append_game
from agentevolver.client.env_client import EnvClient
from agentevolver.module.agent_flow.game_loop import GameOutcome, play_game
from agentevolver.schema import ChatMessage

__all__ = ["lineups", "play_round"]


def lineups(players: Sequence[PlayerSpec], tasks: Sequence[str]) -> list[tuple[str, tuple[PlayerSpec, PlayerSpec]]]:
    """``(task, (first seat's player, second seat's player))`` for every pair, task and seat order."""
    return [(task, order) for a, b in combinations(players, 2) for task in tasks for order in ((a, b), (b, a))]


async def play_round(env: EnvClient, env_type: str, players: Sequence[PlayerSpec], tasks: Sequence[str], *,
                     factory: PlayerFactory, results: Path, max_moves: int, params: Mapping[str, Any],
                     progress: Callable[[int, int, GameOutcome], None] | None = None) -> list[GameOutcome]:
    """Play every lineup once (module docstring); each game is in ``results`` before the next starts."""
    outcomes = []
    schedule = lineups(players, tasks)
    for number, (task, order) in enumerate(schedule, 1):
        seat_of: dict[str, PlayerSpec] = {}

        def build(seat: str, opening: list[ChatMessage], order: tuple[PlayerSpec, ...] = order,
                  seat_of: dict[str, PlayerSpec] = seat_of) -> Any:
            index = len(seat_of)
            if index >= len(order):
                raise ValueError(f"the game has more seats than the arena seats players ({len(order)}); "
                                 "a game with more seats needs a lineup per seat")
            seat_of[seat] = order[index]
            return factory(order[index], opening)

        outcome = await play_game(env, env_type, task, players=build, max_moves=max_moves, params=params)
        outcomes.append(outcome)
        if outcome.termination != "env_error":
            append_game(results, env_type=env_type, task_id=task,
                        players={seat: spec.name for seat, spec in seat_of.items()},
                        specs={spec.name: spec.spec for spec in seat_of.values()}, scores=outcome.scores,
                        game=outcome.record())
        if progress is not None:
            progress(number, len(schedule), outcome)
    return outcomes
