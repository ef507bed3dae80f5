"""``game``: turn-based games for several seats, each seat played by a policy of its own (docs/env_games.md).

The environment holds the game state and says whose turn it is; it never knows who plays a seat (the trained
policy, a frozen checkpoint, a scripted player or any OpenAI-compatible endpoint: the episode source
:mod:`agentevolver.module.agent_flow.game` and the arena decide). Games plug in through
:mod:`env_service.environments.game.rules` (the adapter shape); :mod:`.tictactoe` is the first.

Task ids are ``<game>-<split>-<nnn>`` (``tictactoe-train-007``); a split is ``train`` / ``val`` / ``test`` (every
game's tasks) or ``<split>/<game>``. Protocol over the service's ordinary routes:

* ``/create`` -> the first mover's opening and observation (so a single-seat client can play as it plays any
  environment); ``/get_info`` -> ``game``: ``seats``, ``turn`` (None when over), ``openings`` (seat -> its
  opening messages), ``observation`` (what the seat to move sees now), ``legal_actions`` and ``bots`` (named
  scripted moves) of the seat to move, ``scores`` (seat -> [0, 1]), ``over``, ``moves`` so far, ``summary``;
  and ``seats``, ``turn`` and ``openings`` at the top level too, the keys by which any environment says seats take
  turns in it (read by clients that are not game-specific: Self-Questioning's explorer plays every seat in turn).
* ``/step`` with an assistant message whose ``name`` is the seat to move: its text is the move. The answer's
  ``state`` is what the *next* seat to move sees (the same seat again, with the reason, after an illegal move),
  ``info.turn`` names that seat, ``info.game`` repeats ``/get_info``'s facts but the openings; on the last move
  ``is_terminated``, ``info.game.scores`` and, as ``state``, how the game ended (the rules' ``outcome()``) with every
  seat's score. ``RESIGN`` forfeits; an illegal move past
  ``params.illegal_retries`` (default 1) forfeits. With ``params.on_illegal: random`` an illegal move is
  replaced by a random legal one instead (the game always reaches its end, which a small model's early games
  otherwise rarely do) and costs its seat ``params.illegal_penalty`` (default 0.25) of its score (kept in
  [0, 1]). A message without ``name``, or for a seat whose turn it is not, is a 400 naming ``messages.name``.
* ``/evaluate`` -> the score of ``params.seat`` given at ``/create`` (default: the first seat); sparse = 1 for a
  win only. Every seat's score is in ``/get_info``'s ``game.scores``.

Split ``explore`` lists one exploration seed per game (``explore-tictactoe``, :mod:`.seeds`): a fresh game, played
as any, not a task: its step reward and ``/evaluate`` are 0.
"""

from __future__ import annotations

import random
from typing import Any

from agentevolver.schema import ChatMessage
from env_service.base import BaseEnv, StepOutcome
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, is_seed
from env_service.environments.game import tictactoe as _tictactoe  # noqa: F401  (registers its rules)
from env_service.environments.game.rules import GAMES, GameRules, Illegal
from env_service.environments.game.seeds import NOT_A_TASK, seed_game, seed_query, seed_task_ids
from env_service.errors import BadAction, EnvServiceError, UnknownSplit, UnknownTask
from env_service.registry import register_env

__all__ = ["RESIGN", "GameEnv"]

#: The text a seat sends to give up (the episode source sends it for a seat whose player failed).
RESIGN = "RESIGN"
SPLITS = ("train", "val", "test")


def _parse_task(task_id: str) -> tuple[type[GameRules], str, int]:
    """``<game>-<split>-<n>`` -> (rules class, split, index); an unknown id names ``task_id``."""
    game, _, rest = task_id.partition("-")
    split, _, number = rest.partition("-")
    if game not in GAMES or split not in SPLITS or not number.isdigit():
        raise UnknownTask(f"no game task {task_id!r}; ids look like '<game>-<split>-<n>' with game one of "
                          f"{', '.join(GAMES.names())} and split one of {', '.join(SPLITS)}", field="task_id")
    rules = GAMES.get(game)
    index = int(number)
    if index >= rules.split_sizes.get(split, 0):
        raise UnknownTask(f"{game} has {rules.split_sizes.get(split, 0)} {split} tasks; {task_id!r} is not one",
                          field="task_id")
    return rules, split, index


@register_env("game")
class GameEnv(BaseEnv):
    """One game on one task (module docstring)."""

    isolation = "inline"  # pure Python, microseconds per move

    @classmethod
    def splits(cls) -> list[str]:
        return list(SPLITS)  # task splits; the seed split ``explore`` holds no task (check_split accepts it)

    @classmethod
    def check_split(cls, split: str) -> None:
        if split == EXPLORE_SPLIT:
            return
        base, _, game = split.partition("/")
        if base not in SPLITS or (game and game not in GAMES):
            raise UnknownSplit(f"game has splits {', '.join(SPLITS)}, optionally '<split>/<game>' with game one of "
                               f"{', '.join(GAMES.names())}, and {EXPLORE_SPLIT!r} for the exploration seeds (one per "
                               f"game); got {split!r}", field="params.split")

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        if split == EXPLORE_SPLIT:
            return seed_task_ids()
        base, _, only = split.partition("/")
        return [f"{name}-{base}-{index:03d}" for name in GAMES.names() if not only or name == only
                for index in range(GAMES.get(name).split_sizes.get(base, 0))]

    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        super().__init__(task_id, instance_id, params)
        #: The seed's question to every seat, or None for a task.
        self.seed_query: str | None = None
        if is_seed(task_id):
            self.game: GameRules = seed_game(task_id).fresh(params)
            self.seed_query = seed_query(task_id)
        else:
            rules, split, index = _parse_task(task_id)
            self.game = rules.from_task(split, index, params)
        retries = params.get("illegal_retries", 1)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise EnvServiceError(f"params.illegal_retries must be an integer from 0 to 10, got {retries!r}",
                                  field="params.illegal_retries")
        self.illegal_retries = retries
        self.on_illegal = params.get("on_illegal", "retry")
        if self.on_illegal not in ("retry", "random"):
            raise EnvServiceError(f"params.on_illegal must be 'retry' or 'random', got {self.on_illegal!r}",
                                  field="params.on_illegal")
        penalty = params.get("illegal_penalty", 0.25)
        if isinstance(penalty, bool) or not isinstance(penalty, int | float) or not 0 <= penalty <= 1:
            raise EnvServiceError(f"params.illegal_penalty must be a number from 0 to 1, got {penalty!r}",
                                  field="params.illegal_penalty")
        self.illegal_penalty = float(penalty)
        self.penalties: dict[str, float] = dict.fromkeys(self.game.seats(), 0.0)
        self.rng = random.Random(instance_id)
        seat = params.get("seat", self.game.seats()[0])
        if seat not in self.game.seats():
            raise EnvServiceError(f"params.seat must be one of {self.game.seats()}, got {seat!r}",
                                  field="params.seat")
        self.scored_seat: str = seat
        self.strikes: dict[str, int] = dict.fromkeys(self.game.seats(), 0)
        self.moves: list[dict[str, Any]] = []

    def reset(self) -> list[ChatMessage]:
        seat = self.game.to_move()
        assert seat is not None, "a task's opening position is never a finished game"
        return [*self._opening(seat), *self.game.observation(seat)]

    def _opening(self, seat: str) -> list[ChatMessage]:
        """The seat's opening; in a seed, its system prompt ends with the seed's question."""
        opening = self.game.opening(seat)
        if self.seed_query is None or not opening or opening[0].role != "system":
            return opening
        system = opening[0].model_copy(update={"content": f"{opening[0].content}\n\n{self.seed_query}"})
        return [system, *opening[1:]]

    def step(self, action: ChatMessage) -> StepOutcome:
        seat = self.game.to_move()
        if seat is None:
            raise BadAction("the game is over; create a new instance to play again", field="messages")
        if action.role != "assistant" or action.name != seat:
            raise BadAction(f"it is seat {seat!r}'s turn: send an assistant message with name={seat!r} "
                            f"(got role {action.role!r}, name {action.name!r})", field="messages.name")
        text = action.content or ""
        illegal = self._play(seat, text)
        info: dict[str, Any] = {"seat": seat, "turn": self.game.to_move(), "game": self._facts(openings=False)}
        following = self.game.to_move()
        if following is None:
            state = [self._game_over()]
        else:
            state = self.game.observation(following)
            if illegal is not None:
                info["illegal"] = illegal.reason
                state = [ChatMessage(role="user", content=f"Illegal move: {illegal.reason}.\n{state[0].content}"),
                         *state[1:]]
        over = following is None
        reward = self.evaluate(sparse=False) if over else 0.0
        if over and self.seed_query is not None:
            info["note"] = NOT_A_TASK
        return StepOutcome(state=state, reward=reward, is_terminated=over, info=info)

    def _game_over(self) -> ChatMessage:
        """The last step's observation: how the game ended and every seat's score, so that a record of the
        game (an episode's, an exploration's) says who won, not only the moves that led there."""
        scores = ", ".join(f"{seat} {score:g}" for seat, score in self.scores().items())
        return ChatMessage(role="user", content=f"{self.game.outcome()}\nScores: {scores}.")

    def _play(self, seat: str, text: str) -> Illegal | None:
        """Apply one move (or a resignation); an illegal one past the retries forfeits."""
        if text.strip() == RESIGN:
            self.game.forfeit(seat)
            self.moves.append({"seat": seat, "text": text, "legal": True, "resigned": True})
            return None
        illegal = self.game.apply(seat, text)
        self.moves.append({"seat": seat, "text": text, "legal": illegal is None,
                           **({"reason": illegal.reason} if illegal else {})})
        if illegal is not None and self.on_illegal == "random":
            replacement = self.rng.choice(self.game.legal_actions(seat))
            self.game.apply(seat, replacement)
            self.moves[-1]["replaced_by"] = replacement
            self.penalties[seat] += self.illegal_penalty
            return None
        if illegal is not None:
            self.strikes[seat] += 1
            if self.strikes[seat] > self.illegal_retries:
                self.game.forfeit(seat)
                return None
        return illegal

    def _facts(self, *, openings: bool) -> dict[str, Any]:
        seat = self.game.to_move()
        facts: dict[str, Any] = {
            "seats": self.game.seats(), "turn": seat, "over": seat is None, "scores": self.scores(),
            "legal_actions": self.game.legal_actions(seat) if seat else [],
            "bots": self.game.bots(seat) if seat else {},
            "observation": [m.model_dump(exclude_none=True) for m in self.game.observation(seat)] if seat else [],
            "moves": list(self.moves), "summary": self.game.summary(),
        }
        if openings:
            facts["openings"] = {s: [m.model_dump(exclude_none=True) for m in self._opening(s)]
                                 for s in self.game.seats()}
        return facts

    def scores(self) -> dict[str, float]:
        """Each seat's score: the game's, less its illegal-move penalties (``on_illegal: random``), in [0, 1]."""
        return {seat: min(max(score - self.penalties[seat], 0.0), 1.0) for seat, score in self.game.scores().items()}

    def evaluate(self, sparse: bool) -> float:
        """The scored seat's score once the game is over; 0 for an exploration seed (not a task)."""
        over = self.game.to_move() is None and self.seed_query is None
        score = self.scores()[self.scored_seat] if over else 0.0
        return (1.0 if score >= 1.0 else 0.0) if sparse else score

    def info(self) -> dict[str, Any]:
        """``game`` (every fact, module docstring) and, at the top level, the seat keys any client of a
        multi-seat environment reads without knowing it is a game (:meth:`seat_keys`)."""
        game = self._facts(openings=True)
        return {**super().info(), **self.seat_keys(game), "game": game,
                **({"note": NOT_A_TASK} if self.seed_query is not None else {})}

    @staticmethod
    def seat_keys(game: dict[str, Any]) -> dict[str, Any]:
        """``seats``, ``turn`` (None once over) and ``openings`` (seat -> its opening): how an environment says
        that seats take turns in it. A client that plays whichever seat is to move - the task manager's
        explorer (:class:`agentevolver.module.task_manager.exploration.Seating`) - needs them before the first
        ``/step`` (which takes a move only with ``name`` = the seat to move) and each seat's own opening to act
        in its view; every step's ``info.turn`` then names the next seat."""
        return {key: game[key] for key in ("seats", "turn", "openings")}
