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
"""

from __future__ import annotations

import json
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from agentevolver.module.task_manager.deps import ROLE_EXPLORER, TaskManagerDeps
from agentevolver.module.task_manager.prompts import EXPLORER_INSTRUCTIONS, EXPLORER_OPENINGS, EXPLORER_TOOLS
from agentevolver.module.task_manager.transcript import for_chat_server
from agentevolver.module.tools import truncate_text
from agentevolver.module.tools.config import make_parser
from agentevolver.module.tools.parsing.hermes import HermesParser
from agentevolver.registry import Registry
from agentevolver.schema import ChatMessage, Task, Trajectory

__all__ = ["EXPLORATION_STRATEGIES", "ExplorationStrategy", "RandomWalk", "query_position"]

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


class ExplorationStrategy(ABC):
    """Base of every strategy: built with the task manager's dependencies, called from worker threads.

    ``explore`` must not keep per-call state on ``self`` (explorations run concurrently). The returned
    trajectory's ``messages`` start with the environment's opening messages; ``metadata`` holds
    ``query_index`` (the message stating the seed task, masked before summarising) and ``opening_len``.
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
        created = env.create(seed.env_type, seed.task_id, params=self.deps.create_params)
        instance_id = created.info.instance_id
        try:
            opening = list(created.state)
            query_index = query_position(opening)
            if seed.query is not None and query_index is not None:
                opening[query_index] = opening[query_index].model_copy(update={"content": seed.query})
            query = opening[query_index].content if query_index is not None else seed.query
            focus = self.focus(seed, round_index)
            start = self.opening(seed, round_index)
            steps, terminated, reason = self._walk(instance_id, opening, tools, focus, start,
                                                   lambda step: self.sampling(seed, round_index, step))
        finally:
            env.release(instance_id)
        return Trajectory(
            task_id=seed.task_id, rollout_id=round_index, env_type=seed.env_type, query=query,
            messages=[*opening, *steps], is_terminated=terminated, termination_reason=reason,
            num_steps=sum(1 for m in steps if m.role == "assistant"),
            metadata={"query_index": query_index, "opening_len": len(opening), "focus": focus, "opening": start},
        )

    def _instructions(self, tools: list[dict], focus: list[str], start: str) -> str:
        schemas = EXPLORER_TOOLS.format(schemas=json.dumps(tools, ensure_ascii=False)) if tools else ""
        return EXPLORER_INSTRUCTIONS.format(max_steps=self.max_steps, focus="; ".join(focus), opening=start,
                                            profile=self.deps.profile.render(), tools=schemas)

    def _walk(self, instance_id: str, opening: list[ChatMessage], tools: list[dict], focus: list[str], start: str,
              sampling: Callable[[int], dict[str, Any]]) -> tuple[list[ChatMessage], bool, str]:
        """Up to ``max_steps`` (reply -> parse -> step) rounds; returns the new messages and how it ended."""
        env = self.deps.env_client()
        instructions = self._instructions(tools, focus, start)
        steps: list[ChatMessage] = []
        for step in range(self.max_steps):
            chat = _with_instructions(for_chat_server([*opening, *steps], self.max_chars, tagged_calls=self.tagged_calls),
                                      instructions)
            text = self.explorer.chat(chat, **sampling(step)).text
            action = self.parser.parse(text, step=step, tools=tools or None)
            message = ChatMessage(role="assistant", content=text, tool_calls=action.tool_calls or None)
            outcome = env.step(instance_id, message)
            steps.append(message)
            steps.extend(m.model_copy(update={"content": truncate_text(m.content, self.max_chars)[0]})
                         for m in outcome.state)
            if outcome.info.get("instance_lost"):
                return steps, False, "env_error"
            if outcome.is_terminated:
                return steps, True, "terminated"
        return steps, False, "max_steps"


def _with_instructions(messages: list[dict[str, str]], instructions: str) -> list[dict[str, str]]:
    """The explorer's instructions joined to the environment's system message (one system message: some
    chat templates accept no other), or put first when the environment has none."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{instructions}"}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]
