"""Exploration strategies: how the explorer LLM walks an environment to produce a trajectory.

A strategy is registered by name (``task_manager.strategy``) and turns one seed task plus a round index
into a :class:`~agentevolver.schema.Trajectory`. The built-in ``random`` strategy is a random walk: the
``task_explorer`` LLM (an OpenAI-compatible endpoint, not the policy) acts in an instance of the seed task
through the environment service for up to ``max_explore_step`` steps, steered towards a random pick of the
profile's operations and a drawn opening (:data:`~.prompts.EXPLORER_OPENINGS`, with numbers to start from), so
that the ``n`` explorations of one seed differ even at temperature 0. The explorer samples
(``task_manager.explorer_temperature``) with a seed per exploration and step, and every draw derives from
``task_manager.explore_seed``: a run is reproducible, and another seed writes other tasks (a greedy explorer
with fixed prompts wrote the same few bare sums in every run). Its replies are read with the agent flow's tool
parser (``agent_flow.tools.tool_parser``), so the environment gets actions in the same shape as the policy's.

Multi-seat environments (a game: seats that take turns) are explored seat by seat (:class:`Seating`). After
``/create`` the walk reads ``/get_info`` once: an environment whose answer names ``seats`` and the seat to move
(``turn``) is multi-seat, and its ``openings`` (seat -> that seat's opening) say what each seat is told. At every
step the explorer is told which seat it plays (:data:`~.prompts.EXPLORER_SEAT`) and acts as that seat, in that
seat's own view (its opening, the observations the environment gave it, its own moves): a reply written from
the first mover's view, sent without ``name``, is rejected by a game (its ``/step`` takes a move only from the
seat whose turn it is, named in ``name``), and after the first move that view is the wrong seat's anyway. The
move goes to ``/step`` with ``name`` = the seat; the answer's ``state`` is what the *next* seat to move sees
and its ``info.turn`` names that seat. So one exploration plays legal moves for every seat until the game ends
or ``max_explore_step`` moves; the recorded trajectory is one coherent game: the first mover's opening, then
each move (an assistant message whose ``name`` is its seat) followed by what the next seat to move was shown.
An environment whose ``/get_info`` names no turn is single-seat and explored exactly as before.
"""

from __future__ import annotations

import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.module.task_manager.deps import ROLE_EXPLORER, TaskManagerDeps
from agentevolver.module.task_manager.profile import constrained_tools
from agentevolver.module.task_manager.prompts import (
    EXPLORER_INSTRUCTIONS,
    EXPLORER_OPENINGS,
    EXPLORER_SEAT,
    EXPLORER_TOOLS,
)
from agentevolver.module.task_manager.transcript import for_chat_server
from agentevolver.module.tools import truncate_text
from agentevolver.module.tools.config import make_parser
from agentevolver.module.tools.parsing.hermes import HermesParser
from agentevolver.registry import Registry
from agentevolver.schema import ChatMessage, StepData, Task, Trajectory

__all__ = ["EXPLORATION_STRATEGIES", "ExplorationStrategy", "RandomWalk", "Seating", "query_position"]

logger = logging.getLogger(__name__)

#: Exploration strategies by name (``task_manager.strategy``).
EXPLORATION_STRATEGIES: Registry[Callable[..., ExplorationStrategy]] = Registry(
    "exploration strategy", "task_manager.strategy"
)

#: Operations of the profile a random walk is pointed at first.
FOCUS_OPERATIONS = 2
#: Numbers an opening suggests starting from, and their range.
OPENING_NUMBERS, OPENING_RANGE = 3, (2, 999)


def query_position(opening: list[ChatMessage]) -> int | None:
    """Index of the message that states the task: the last user message of the environment's opening."""
    for index in range(len(opening) - 1, -1, -1):
        if opening[index].role == "user":
            return index
    return None


@dataclass
class Seating:
    """Who acts at each step of an exploration, and what that actor has seen (module docstring).

    A single-seat environment has one actor, seat ``None``, whose view is the whole record: the opening and
    every step, exactly what the explorer was shown before seats existed. A multi-seat environment gives every
    seat a view of its own: the first mover's is the ``/create`` opening (which ends with its observation),
    every other seat's its opening from ``/get_info``'s ``openings``, to which the observations it is given
    and its own moves are added as the game goes on.
    """

    turn: str | None
    views: dict[str | None, list[ChatMessage]]

    @classmethod
    def single(cls, opening: list[ChatMessage]) -> Seating:
        """The one actor of a single-seat environment."""
        return cls(None, {None: list(opening)})

    @classmethod
    def from_info(cls, info: Mapping[str, Any], opening: list[ChatMessage]) -> Seating:
        """Seats from an instance's ``/get_info`` answer (``seats``, ``turn``, ``openings``) right after
        ``/create``, whose ``opening`` is the view of the seat to move; single-seat when it names no turn."""
        seats, turn = info.get("seats"), info.get("turn")
        if not isinstance(seats, list) or not isinstance(turn, str) or turn not in seats:
            return cls.single(opening)
        openings = info.get("openings") or {}
        views: dict[str | None, list[ChatMessage]] = {
            str(seat): list(opening) if seat == turn else _messages(openings.get(seat) or []) for seat in seats}
        return cls(turn, views)

    @property
    def seats(self) -> list[str]:
        """The seat names; [] for a single-seat environment."""
        return [seat for seat in self.views if seat is not None]

    def view(self) -> list[ChatMessage]:
        """What the actor to move has seen: the conversation the explorer replies to."""
        return self.views[self.turn]

    def advance(self, move: ChatMessage, observation: list[ChatMessage], turn: str | None) -> None:
        """Record the actor's ``move``; ``observation`` goes to the actor to move next: ``turn`` (multi-seat)
        or the same one (single-seat)."""
        self.views[self.turn].append(move)
        if self.turn is not None and turn is not None:
            self.turn = turn
        self.views.setdefault(self.turn, []).extend(observation)


class ExplorationStrategy(ABC):
    """Base of every strategy: built with the task manager's dependencies, called from worker threads.

    ``explore`` must not keep per-call state on ``self`` (explorations run concurrently). The returned
    trajectory's ``messages`` start with the environment's opening messages; ``metadata`` holds
    ``query_index`` (the message stating the seed task, masked before summarising) and ``opening_len``, and, for a
    multi-seat environment, ``seats`` (:class:`Seating`).
    """

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps

    @abstractmethod
    def explore(self, seed: Task, round_index: int) -> Trajectory:
        """Explore the environment from ``seed``; raise EnvClientError / LLMError when the services fail."""


@EXPLORATION_STRATEGIES.register("random")
class RandomWalk(ExplorationStrategy):
    """The explorer LLM acts freely in the seed task's instance (see the module docstring)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        super().__init__(deps)
        self.explorer = deps.client(ROLE_EXPLORER)
        self.parser = make_parser(deps.settings.agent_flow.tools)
        self.tagged_calls = isinstance(self.parser, HermesParser)
        self.max_steps = deps.section.max_explore_step
        self.max_chars = deps.section.max_observation_chars

    def _draw(self, seed: Task, round_index: int) -> random.Random:
        """The exploration's own random stream: (``task_manager.explore_seed``, seed task, round)."""
        return random.Random(f"{self.deps.section.explore_seed}|{seed.task_id}#{round_index}")

    def focus(self, seed: Task, round_index: int) -> list[str]:
        """The operations this exploration starts with: a reproducible draw (:meth:`_draw`)."""
        pairs = self.deps.profile.operations()
        picked = self._draw(seed, round_index).sample(pairs, k=min(FOCUS_OPERATIONS, len(pairs)))
        return [f"{op.name} on {entity.name}" for entity, op in picked]

    def opening(self, seed: Task, round_index: int) -> str:
        """How this exploration opens: a drawn :data:`~.prompts.EXPLORER_OPENINGS` line with drawn numbers."""
        rng = self._draw(seed, round_index)
        rng.random()  # not the focus draw's first number
        numbers = sorted(rng.sample(range(OPENING_RANGE[0], OPENING_RANGE[1] + 1), OPENING_NUMBERS))
        return rng.choice(EXPLORER_OPENINGS).format(numbers=", ".join(map(str, numbers)))

    def sampling(self, seed: Task, round_index: int, step: int) -> dict[str, Any]:
        """Request fields of the explorer's reply at ``step``: the temperature, a seed for the sample and the
        reply's token cap."""
        draw = self._draw(seed, round_index).getrandbits(31)
        section = self.deps.section
        return {"temperature": section.explorer_temperature, "seed": (draw + step) % 2**31,
                "max_tokens": section.explorer_max_tokens}

    def explore(self, seed: Task, round_index: int) -> Trajectory:
        env = self.deps.env_client()
        tools = env.tools(seed.env_type) or []
        created = env.create(seed.env_type, seed.task_id, params=self.deps.exploration_params)
        instance_id = created.info.instance_id
        try:
            opening = list(created.state)
            query_index = query_position(opening)
            if seed.query is not None and query_index is not None:
                opening[query_index] = opening[query_index].model_copy(update={"content": seed.query})
            query = opening[query_index].content if query_index is not None else seed.query
            seating = Seating.from_info(_seat_facts(env, instance_id), opening)
            focus = self.focus(seed, round_index)
            start = self.opening(seed, round_index)
            steps, terminated, reason = self._walk(instance_id, seating, tools, focus, start,
                                                   lambda step: self.sampling(seed, round_index, step))
        finally:
            env.release(instance_id)
        metadata: dict[str, Any] = {"query_index": query_index, "opening_len": len(opening), "focus": focus,
                                    "opening": start, "tools_offered": len(tools)}
        if seating.seats:
            metadata["seats"] = seating.seats
        return Trajectory(
            task_id=seed.task_id, rollout_id=round_index, env_type=seed.env_type, query=query,
            messages=[*opening, *steps], is_terminated=terminated, termination_reason=reason,
            num_steps=sum(1 for m in steps if m.role == "assistant"), metadata=metadata,
        )

    def _instructions(self, tools: list[dict], focus: list[str], start: str) -> str:
        schemas = EXPLORER_TOOLS.format(schemas=json.dumps(tools, ensure_ascii=False)) if tools else ""
        return EXPLORER_INSTRUCTIONS.format(max_steps=self.max_steps, focus="; ".join(focus), opening=start,
                                            profile=self.deps.profile.render(), tools=schemas)

    def _walk(self, instance_id: str, seating: Seating, tools: list[dict], focus: list[str], start: str,
              sampling: Callable[[int], dict[str, Any]]) -> tuple[list[ChatMessage], bool, str]:
        """Up to ``max_steps`` (reply -> parse -> step) rounds, each by the actor to move in its own view
        (:class:`Seating`); returns the new messages of the record and how it ended."""
        env = self.deps.env_client()
        instructions = self._instructions(tools, focus, start)
        steps: list[ChatMessage] = []
        for step in range(self.max_steps):
            seat = seating.turn
            message = self._reply(seating, instructions, tools, sampling(step), step)
            outcome = env.step(instance_id, message)
            observation = [m.model_copy(update={"content": truncate_text(m.content, self.max_chars)[0]})
                           for m in outcome.state]
            steps.append(message)
            steps.extend(observation)
            if outcome.info.get("instance_lost"):
                return steps, False, "env_error"
            if outcome.is_terminated:
                return steps, True, "terminated"
            turn = None if seat is None else _turn_after(env, instance_id, outcome)
            if seat is not None and turn is None:
                return steps, False, "env_error"  # not over, yet the environment names no seat to move
            seating.advance(message, observation, turn)
        return steps, False, "max_steps"

    def _reply(self, seating: Seating, instructions: str, tools: list[dict], sampling: dict[str, Any],
               step: int) -> ChatMessage:
        """The explorer's next action, written in the view of the actor to move and told which seat that is
        (multi-seat); sent with ``name`` = the seat, which a multi-seat environment requires of a move."""
        seat = seating.turn
        if seat is not None:
            instructions += EXPLORER_SEAT.format(seats=", ".join(seating.seats), seat=seat)
        chat = _with_instructions(for_chat_server(seating.view(), self.max_chars, tagged_calls=self.tagged_calls),
                                  instructions)
        forced = self.deps.section.explorer_tool_choice == "required" and bool(tools)
        if forced:  # the endpoint decodes the reply as one call of a given tool (explorer_tool_choice), its
            # arguments kept to what the profile says the tool accepts (tool_arguments)
            sampling = {**sampling, "tools": constrained_tools(tools, self.deps.profile), "tool_choice": "required",
                        "parallel_tool_calls": False}
        reply = self.explorer.chat(chat, **sampling)
        if forced and reply.tool_calls:
            calls = [call.model_copy(update={"id": call.id or f"call_{step}_{index}"})
                     for index, call in enumerate(reply.tool_calls)]
            return ChatMessage(role="assistant", content=reply.text, tool_calls=calls, name=seat)
        # auto, or a forced reply that came back without a call (cut by the token limit): parse the text
        action = self.parser.parse(reply.text, step=step, tools=tools or None)
        return ChatMessage(role="assistant", content=reply.text, tool_calls=action.tool_calls or None, name=seat)


def _seat_facts(env: EnvClient, instance_id: str) -> Mapping[str, Any]:
    """The instance's ``/get_info`` answer, read for its seats (:meth:`Seating.from_info`); {} (single-seat)
    from a service that gives none it can parse (the reference's BFCL answers a string): a service that is down
    says so at the next ``/step``."""
    try:
        return env.get_info(instance_id)
    except EnvClientError as err:
        logger.debug("no /get_info answer for %s (%s): explored as a single-seat environment", instance_id, err)
        return {}


def _turn_after(env: EnvClient, instance_id: str, outcome: StepData) -> str | None:
    """The seat to move after a step: the answer's ``info.turn``, or ``/get_info``'s when the answer has none
    (a fallback observation the client made up after the service failed)."""
    info: Mapping[str, Any] = outcome.info if "turn" in outcome.info else env.get_info(instance_id)
    turn = info.get("turn")
    return turn if isinstance(turn, str) else None


def _messages(raw: list[Any]) -> list[ChatMessage]:
    """Messages as ``/get_info`` sends them (plain dicts)."""
    return [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in raw]


def _with_instructions(messages: list[dict[str, str]], instructions: str) -> list[dict[str, str]]:
    """The explorer's instructions joined to the environment's system message (one system message: some
    chat templates accept no other), or put first when the environment has none."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instructions}"}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]
