"""game's exploration seeds (split ``explore``): one per game, ``explore-tictactoe``.

Why per game: a game has no function tools; what a seat can do is write its game's moves (tic-tac-toe's
``MOVE: <n>``, and ``RESIGN``), so the game is the one tool there is to find out about. A seed is a fresh game
(:meth:`~.rules.GameRules.fresh`: the starting position, no move played, not one of the tasks' openings) whose
seats are told, at the end of their system prompt, that it is an exploration and not scored. It is played
like any game, to its end; the step reward and ``/evaluate`` are 0 (:data:`NOT_A_TASK`), while ``game.scores``
still says how the game went. Self-Questioning explores the seeds when no human task is given
(:mod:`env_service.environments.exploration_seeds`).
"""

from __future__ import annotations

from env_service.environments.exploration_seeds import seed_id, seed_tool
from env_service.environments.game.rules import GAMES, GameRules
from env_service.errors import UnknownTask

__all__ = ["NOT_A_TASK", "seed_game", "seed_query", "seed_task_ids"]

#: What a seed's ``evaluate`` means (also in ``info()["note"]`` and the last step's ``info``).
NOT_A_TASK = "This is an exploration seed, not a task: the game is played but not scored, so it scores 0."


def seed_task_ids() -> list[str]:
    """The seed ids, one per registered game."""
    return [seed_id(name) for name in GAMES.names()]


def seed_game(task_id: str) -> type[GameRules]:
    """The rules of the game the seed ``task_id`` names; :class:`UnknownTask` for an ``explore-`` id that is none."""
    name = seed_tool(task_id)
    if name not in GAMES:
        raise UnknownTask(f"game has no exploration seed {task_id!r}; seeds (one per game): "
                          f"{', '.join(seed_task_ids())}", field="task_id")
    return GAMES.get(name)


def seed_query(task_id: str) -> str:
    """What every seat of the seed's game is told (after its system prompt)."""
    return (f"This game is an exploration seed, not a task: find out how `{seed_tool(task_id)}` is played. Make "
            "moves, see how the game answers them, and learn what wins; the game is not scored.")
