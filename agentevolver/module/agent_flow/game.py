"""The ``game`` episode source: one game per episode, the policy being trained playing one or more seats.

Picked when ``game.trained_seats`` is set (:func:`agentevolver.module.agent_flow.sources.source_name`). Each
trained seat has a context manager of its own (its own view of the game: its opening, the observations the
environment gives it, its own moves), generates through the rollout servers with a request id of its own,
token in / token out like an agent-flow episode, and makes its own samples, each carrying **that seat's**
score and the group id ``<group>/<seat>``; every other seat is played by the player ``game.opponents`` names
(:mod:`agentevolver.module.agent_flow.game_players`). The game itself is :func:`~.game_loop.play_game`.

The result is one episode (one row of verl's batch) holding every trained seat's samples; ``EpisodeResult.game``
says which samples are whose, each seat's score and failure. The trainer's ``seat_rows`` stage
(:mod:`agentevolver.verl.step.seat_rows`) makes one episode row per trained seat of it, so advantages are
normalised within (task, seat) groups and a failed seat is kept out of the update alone. The episode's own
reward (what validation reports) is the mean score of its trained seats.

Failures: a trained seat whose generation failed resigns (``failure: rollout`` for that seat only); an opponent
whose endpoint failed resigns (recorded, ``game/opponent_failed``; the trained seats are scored by the game's
rules); the environment failing fails the game (``env``) and it is played again from the start, like an
agent-flow episode, up to ``agent_flow.episode_retries`` times.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Mapping
from typing import Any

from agentevolver.client.env_client import EnvClient
from agentevolver.config.game import parse_player
from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec, Termination
from agentevolver.module.agent_flow.flow import GenerateFn
from agentevolver.module.agent_flow.game_loop import GameOutcome, play_game
from agentevolver.module.agent_flow.game_players import PlayerFailed, SeatPlayer, Turn, make_player
from agentevolver.module.agent_flow.plugins import context_config
from agentevolver.module.context_manager import ContextManager, make_context_manager
from agentevolver.schema import ChatMessage
from agentevolver.schema.trajectory import Reward

__all__ = ["GameEpisodes", "PolicySeat"]

logger = logging.getLogger(__name__)

#: The player of a seat ``game.opponents`` does not name.
DEFAULT_OPPONENT = "scripted:random"


class PolicySeat:
    """A seat played by the policy being trained: its context manager holds its tokens exactly as generated."""

    label = "policy"

    def __init__(self, opening: list[ChatMessage], cm: ContextManager, generate: GenerateFn, request_id: str,
                 sampling_params: Mapping[str, Any], max_tokens_per_turn: int | None) -> None:
        self.opening = opening
        self.cm = cm
        self.generate = generate
        self.request_id = request_id
        self.sampling_params = dict(sampling_params)
        self.max_tokens_per_turn = max_tokens_per_turn
        self.started = False

    async def move(self, turn: Turn) -> str | None:
        if self.started:
            self.cm.add_observation(turn.observation)
        else:
            self.cm.start([*self.opening, *turn.observation])
            self.started = True
        if self.cm.exhausted:
            return None
        max_tokens = self.cm.remaining_budget()
        if self.max_tokens_per_turn is not None:
            max_tokens = min(max_tokens, self.max_tokens_per_turn)
        params = {**self.sampling_params, "max_tokens": max_tokens}
        params.setdefault("logprobs", True)
        try:
            output = await self.generate(self.request_id, prompt_ids=self.cm.next_prompt_ids(), sampling_params=params)
        except (ConfigError, asyncio.CancelledError):
            raise
        except Exception as err:  # the rollout server failed: this seat's failure, the game goes on without it
            logger.exception("game seat %s: generation failed", turn.seat)
            raise PlayerFailed("rollout", f"{type(err).__name__}: {err}") from err
        log_probs = output.log_probs if params.get("logprobs") else None
        return self.cm.add_generation(output.token_ids, log_probs, step=self.cm.num_turns).content


class GameEpisodes:
    """Runs game episodes (module docstring); holds configuration and the opponents' clients only."""

    def __init__(self, settings: AgentEvolverSettings, *, tokenizer: Any, env_client: EnvClient,
                 generate: GenerateFn, max_model_len: int, max_prompt_len: int | None = None,
                 max_response_len: int | None = None) -> None:
        self.config = settings.game
        self.flow = settings.agent_flow
        self.tokenizer = tokenizer
        self.env = env_client
        self.generate = generate
        self.context_config = context_config(self.flow, max_model_len=max_model_len, max_prompt_len=max_prompt_len,
                                             max_response_len=max_response_len)
        if self.flow.context_template == "self_clip":
            raise ConfigError("game episodes do not support agent_flow.context_template=self_clip (its archivist "
                              "would rewrite a seat's view of the game); use linear")
        from agentevolver.client.llm_client import LLMClient

        names = {name for kind, name in map(parse_player, self.config.opponents.values()) if kind == "endpoint"}
        self.clients = {name: LLMClient(settings.llm.endpoints[name], name=name) for name in sorted(names)}

    async def run(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult:
        """One game; a game the environment failed is played again from the start (module docstring)."""
        retries = 0
        while True:
            result = await self._attempt(spec, sampling_params)
            if result.failure != "env" or retries >= self.flow.episode_retries:
                break
            delay = self.flow.episode_retry_backoff_s * 2 ** retries
            retries += 1
            logger.warning("game %s/%s: the environment failed (%s); playing it again in %g s (retry %d of %d)",
                           spec.task_id, spec.rollout_id, result.error, delay, retries, self.flow.episode_retries)
            await asyncio.sleep(delay)
        result.metrics["episode/restarts"] = float(retries)
        return result

    async def _attempt(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult:
        started = time.perf_counter()
        # Scripted opponents draw from (seed, task, rollout): the same for a task's validation game before and
        # after training, so a change in its outcome is the policy's (given the same moves), not the opponent's.
        rng = random.Random(f"{self.config.seed}/{spec.task_id}/{spec.rollout_id}")
        seats: dict[str, SeatPlayer] = {}
        tag = uuid.uuid4().hex[:8]

        def player(seat: str, opening: list[ChatMessage]) -> SeatPlayer:
            if seat in self.config.trained_seats:
                cm = make_context_manager(self.flow.context_template, self.tokenizer, self.context_config)
                made: SeatPlayer = PolicySeat(opening, cm, self.generate, f"{spec.group_id}-{spec.rollout_id}-{seat}-{tag}",
                                              sampling_params, self.flow.max_tokens_per_turn)
            else:
                made = make_player(self.config.opponents.get(seat, DEFAULT_OPPONENT), opening, clients=self.clients,
                                   rng=rng, temperature=self.config.opponent_temperature,
                                   max_tokens=self.config.opponent_max_tokens)
            seats[seat] = made
            return made

        outcome = await play_game(self.env, spec.env_type, spec.task_id, players=player,
                                  max_moves=self.config.max_moves, params=spec.env_params)
        unknown = sorted(set(self.config.trained_seats) - set(outcome.seats)) if outcome.seats else []
        unknown += sorted(set(self.config.opponents) - set(outcome.seats)) if outcome.seats else []
        if unknown:
            raise ConfigError(f"game.trained_seats / game.opponents name seat(s) {unknown} that task "
                              f"{spec.task_id!r} does not have; its seats: {', '.join(outcome.seats)}")
        return self._result(spec, outcome, seats, time.perf_counter() - started)

    def _result(self, spec: EpisodeSpec, outcome: GameOutcome, seats: Mapping[str, SeatPlayer],
                seconds: float) -> EpisodeResult:
        env_failed = outcome.termination == "env_error"
        samples: list[Any] = []
        seat_records: list[dict[str, Any]] = []
        trained_scores: list[float] = []
        for seat in outcome.seats or list(self.config.trained_seats):
            player = seats.get(seat)
            trained = seat in self.config.trained_seats
            score = outcome.scores.get(seat, 0.0)
            failure = "env" if env_failed else (outcome.failures[seat].service if seat in outcome.failures else None)
            record: dict[str, Any] = {
                "seat": seat, "player": player.label if player is not None else None, "trained": trained,
                "score": score, "success": score >= self.flow.success_threshold, "failure": failure,
                "error": outcome.error if env_failed else (outcome.failures[seat].error
                                                           if seat in outcome.failures else None),
                "samples": [], "messages": []}
            if isinstance(player, PolicySeat) and player.started:
                reward = Reward(outcome=score, success_rate=1.0 if record["success"] else 0.0,
                                description=f"seat {seat}: game score {score:g}")
                mine = player.cm.to_samples(task_id=spec.task_id, group_id=f"{spec.group_id}/{seat}",
                                            rollout_id=spec.rollout_id, reward=reward,
                                            extras={"seat": seat, "termination": outcome.termination})
                if player.cm.num_turns:
                    record["samples"] = list(range(len(samples), len(samples) + len(mine)))
                    samples += mine
                record["messages"] = [message.to_dict() for message in player.cm.messages]
            elif player is not None:
                record["messages"] = [message.model_dump(exclude_none=True)
                                      for message in getattr(player, "messages", [])]
            if trained:
                trained_scores.append(score)
            seat_records.append(record)
        mean = sum(trained_scores) / len(trained_scores) if trained_scores and not env_failed else 0.0
        trained_failed = [r for r in seat_records if r["trained"] and r["failure"]]
        termination: Termination = "env_error" if env_failed else (
            "error" if trained_failed and len(trained_failed) == len(trained_scores)
            else ("finished" if outcome.termination == "finished" else "max_steps"))
        moves = outcome.moves
        metrics = {
            "time/total_s": seconds,
            "game/moves": float(len(moves)),
            "game/illegal_moves": float(sum(not move.get("legal", True) for move in moves)),
            "game/opponent_failed": float(sum(1 for r in seat_records if not r["trained"] and r["failure"])),
            "game/seat_failed": float(len(trained_failed)),
            "game/trained_score": mean,
        }
        game = {**outcome.record(), "seats": seat_records, "trained_seats": list(self.config.trained_seats)}
        transcript = [{"role": "assistant", "name": move["seat"], "content": move["text"]} for move in moves]
        return EpisodeResult(
            task_id=spec.task_id, env_type=spec.env_type, group_id=spec.group_id, rollout_id=spec.rollout_id,
            instance_id=outcome.instance_id, termination=termination,
            error=outcome.error or ("; ".join(f"seat {r['seat']}: {r['error']}" for r in trained_failed) or None),
            num_turns=len(moves), samples=samples, messages=transcript, metrics=metrics, game=game,
            reward=Reward(outcome=mean, success_rate=sum(r["success"] for r in seat_records if r["trained"])
                          / max(len(trained_scores), 1) if not env_failed else 0.0,
                          description=f"game {outcome.termination}; scores {outcome.scores}"),
        )
