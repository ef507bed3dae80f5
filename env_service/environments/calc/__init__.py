"""``calc``: arithmetic and unit-conversion questions answered with a ``calculator`` tool.

Built so that RL on a 2-core CPU has signal: the built-in SmolLM2-135M solves a fair share of these
tasks but far from all (baseline and the bench that measures it: ``docs/env_calc.md``), so GRPO groups
of samples on one task usually differ in reward.

Episode protocol:

* ``reset()`` -> system prompt, worked demonstrations as prior turns (``params.demos``, default all),
  and the user's question.
* ``step(assistant message)``:

  - tool calls (``tool_calls``, or - leniently - ``<tool_call>{json}</tool_call>`` blocks in ``content``
    when ``tool_calls`` is empty; read by :func:`env_service.actions.read_tool_calls`, shared by the
    environments) -> one ``tool`` message per call with the result or an explanatory error; not terminal. Tool calls take precedence over any ``FINAL ANSWER`` in the same message,
    because that answer was written before the results were seen;
  - text containing ``FINAL ANSWER`` -> terminal; the number after it is the answer;
  - other text -> a ``user`` nudge, not terminal;
  - on an exploration seed with ``params.explore_past_answers: true``, a ``FINAL ANSWER`` is not terminal
    either: the agent is asked to call a tool again with other inputs (a seed has no answer, and each new
    call is one more task the writer can render), so an exploration runs its ``max_steps``;
  - after ``params.max_steps`` (default 4) assistant messages the episode terminates regardless;
  - ``params.tool_delay_s`` (default 0, at most 30) seconds of wall time per tool call, spent before the
    results come back: the latency of a real tool (a search, a sandbox), so a trainer's overlap of rollout
    and update can be measured on a task that waits (bench/async_trainer.py).

  The step reward is 0.0 except on the terminating step, where it is the episode's score: dense by
  default, sparse with the instance param ``sparse_reward: true`` (as in ``codebox``); ``info["score"]``
  repeats it.
* ``label_steps`` (capability ``step_labels``, ``POST /step_labels``): GOOD/BAD for each agent step of a
  finished episode, from what the question requires (:mod:`env_service.environments.calc.labels`); with
  ``params.task`` (query and answer), of a synthetic task played on the id
  (:mod:`env_service.environments.calc.played_task`).
* ``write_tasks`` (capability ``task_writing``, ``POST /task_writing``): each successful tool call of an
  exploration as a question in the style of calc's own tasks, its result the answer
  (:mod:`env_service.environments.calc.task_writing`).
* split ``explore``: one exploration seed per tool (``explore-calculator``, ``explore-convert_units``), not
  tasks: Self-Questioning explores them when no human task is given (:mod:`env_service.environments.calc.seeds`).
* ``evaluate(sparse)``: 1.0 if the final answer is within tolerance; otherwise sparse gives 0.0 and dense
  gives 0.5 if some tool result was within tolerance of the answer (the model computed it but did not
  report it), else 0.0.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agentevolver.schema import ChatMessage
from agentevolver.schema.step_labels import StepLabel
from agentevolver.schema.task_writing import ObservedCall, Rendering
from env_service.actions import ActionCalls, read_tool_calls
from env_service.base import BaseEnv, StepOutcome
from env_service.environments.calc.answer import has_final_answer, parse_final_answer
from env_service.environments.calc.labels import label_episode
from env_service.environments.calc.played_task import played_task
from env_service.environments.calc.prompts import (
    DEFAULT_DEMOS,
    EXPLORE_ON,
    MAX_DEMOS,
    NUDGE,
    SYSTEM_PROMPT,
    demonstrations,
)
from env_service.environments.calc.seeds import SEED_LEVEL, calc_task, seed_task_ids
from env_service.environments.calc.task_writing import render_tasks
from env_service.environments.calc.tasks import SPLITS, CalcTask, parse_split, split_task_ids
from env_service.environments.calc.tools import run_tool, tool_schemas
from env_service.environments.exploration_seeds import EXPLORE_SPLIT
from env_service.errors import BadAction, EnvServiceError, UnknownSplit
from env_service.registry import register_env

logger = logging.getLogger(__name__)

DEFAULT_MAX_STEPS = 4
#: Credit in dense mode for having computed the right number without reporting it as the final answer.
DENSE_TOOL_CREDIT = 0.5
#: Upper bound of ``params.tool_delay_s`` (a per-call latency beyond this is a hung tool, not a slow one).
MAX_TOOL_DELAY_S = 30.0


def _delay_param(params: dict[str, Any]) -> float:
    """``params.tool_delay_s``: seconds from 0 to :data:`MAX_TOOL_DELAY_S`, or an error naming the field."""
    value = params.get("tool_delay_s", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_TOOL_DELAY_S:
        raise EnvServiceError(f"params.tool_delay_s must be a number of seconds from 0 to {MAX_TOOL_DELAY_S:g}, "
                              f"got {value!r}", field="params.tool_delay_s")
    return float(value)


def _int_param(params: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    """An integer ``params[key]`` within [low, high], or an error naming ``params.<key>``."""
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise EnvServiceError(f"params.{key} must be an integer from {low} to {high}, got {value!r}",
                              field=f"params.{key}")
    return value


def _bool_param(params: dict[str, Any], key: str) -> bool:
    """``params[key]`` as true or false (default false), or an error naming ``params.<key>``."""
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise EnvServiceError(f"params.{key} must be true or false, got {value!r}", field=f"params.{key}")
    return value


@register_env("calc")
class CalcEnv(BaseEnv):
    """One episode of one ``calc`` task (see the module docstring for the protocol)."""

    isolation = "inline"  # pure Python, microseconds per step, holds nothing

    @classmethod
    def splits(cls) -> list[str]:
        return list(SPLITS)  # task splits; the seed split ``explore`` holds no task (check_split accepts it)

    @classmethod
    def check_split(cls, split: str) -> None:
        """Accept ``<split>``, the level-filtered ``<split>/<level>[+<level>...]`` (e.g. ``train/single+chain``)
        and ``explore`` (the exploration seeds)."""
        if split == EXPLORE_SPLIT:
            return
        try:
            parse_split(split)
        except ValueError as err:
            raise UnknownSplit(f"{err}; or {EXPLORE_SPLIT!r} for the exploration seeds (one per tool)",
                               field="params.split") from err

    @classmethod
    def task_ids(cls, split: str) -> list[str]:
        cls.check_split(split)
        return seed_task_ids() if split == EXPLORE_SPLIT else split_task_ids(split)

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        return tool_schemas()

    @classmethod
    def label_steps(cls, task_id: str, messages: list[ChatMessage], params: dict[str, Any]) -> list[StepLabel]:
        """GOOD/BAD per agent step from what the task requires (capability ``step_labels``; rules:
        :mod:`env_service.environments.calc.labels`). ``params.task`` labels a synthetic task played on this id
        (:mod:`env_service.environments.calc.played_task`)."""
        return label_episode(played_task(calc_task(task_id), params), messages)

    @classmethod
    def write_tasks(cls, calls: list[ObservedCall], seed_query: str | None, limit: int | None,
                    all_renderings: bool = False) -> Rendering:
        """Each successful calculator / unit-converter call as a question like calc's own (capability
        ``task_writing``; rules: :mod:`env_service.environments.calc.task_writing`)."""
        return render_tasks(calls, seed_query=seed_query, limit=limit, all_renderings=all_renderings)

    def __init__(self, task_id: str, instance_id: str, params: dict[str, Any]) -> None:
        super().__init__(task_id, instance_id, params)
        self.task: CalcTask = calc_task(task_id)
        self.max_steps = _int_param(params, "max_steps", DEFAULT_MAX_STEPS, 1, 50)
        self.num_demos = _int_param(params, "demos", DEFAULT_DEMOS, 0, MAX_DEMOS)
        self.tool_delay_s = _delay_param(params)
        self.sparse_reward = _bool_param(params, "sparse_reward")
        # a task's answer still ends its episode: only a seed explores on
        self.explore_past_answers = _bool_param(params, "explore_past_answers") and self.task.level == SEED_LEVEL
        self.steps = 0
        self.terminated = False
        self.final_answer: float | None = None
        self.answered = False
        self.tool_values: list[float] = []

    # ------------------------------------------------------------------ episode
    def reset(self) -> list[ChatMessage]:
        self.steps, self.terminated, self.final_answer, self.answered = 0, False, None, False
        self.tool_values = []
        return [ChatMessage(role="system", content=SYSTEM_PROMPT), *demonstrations(self.num_demos),
                ChatMessage(role="user", content=self.task.query)]

    def step(self, action: ChatMessage) -> StepOutcome:
        if action.role != "assistant":
            raise BadAction(f"calc expects an assistant message, got role {action.role!r}", field="messages")
        if self.terminated:
            raise BadAction("the episode is over; create a new instance to play again", field="messages")
        self.steps += 1
        info: dict[str, Any] = {"step": self.steps}
        calls = read_tool_calls(action, self.steps)
        if calls.calls or calls.problems:
            state = self._answer_calls(calls, info)
        elif has_final_answer(action.content) and self.explore_past_answers:
            state = [ChatMessage(role="user", content=EXPLORE_ON)]
            info["explore_on"] = True
        elif has_final_answer(action.content):
            self.answered = True
            self.final_answer = parse_final_answer(action.content)
            self.terminated = True
            info.update(reason="final_answer", final_answer=self.final_answer)
            state = []
        else:
            state = [ChatMessage(role="user", content=NUDGE)]
            info["nudged"] = True
        if not self.terminated and self.steps >= self.max_steps:
            self.terminated = True
            info["reason"] = "max_steps"
        reward = 0.0
        if self.terminated:
            reward = info["score"] = self.evaluate(sparse=self.sparse_reward)
            logger.debug("calc %s (%s): ended after %d steps (%s), reward %.2f", self.instance_id, self.task_id,
                         self.steps, info["reason"], reward)
        return StepOutcome(state=state, reward=reward, is_terminated=self.terminated, info=info)

    def _answer_calls(self, calls: ActionCalls, info: dict[str, Any]) -> list[ChatMessage]:
        """Run each call and answer it with a ``tool`` message; if no ``<tool_call>`` block of the text could
        be read, say why instead (the model learns the format from it)."""
        if calls.from_text:
            info["text_tool_calls"] = True
        if not calls.calls:
            info.update(tool_calls=0, tool_errors=len(calls.problems))
            hint = ('Write it as <tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 31"}}'
                    "\n</tool_call>")
            return [ChatMessage(role="user", content=f"Your tool call could not be read: {calls.problems[0]}. {hint}")]
        messages = []
        errors = 0
        if self.tool_delay_s:
            time.sleep(self.tool_delay_s * len(calls.calls))  # the instance's own thread (env_service.hosts)
        for call in calls.calls:
            result = run_tool(call.function.name, call.function.arguments)
            if result.value is not None:
                self.tool_values.append(result.value)
            else:
                errors += 1
            messages.append(ChatMessage(role="tool", content=result.text, name=call.function.name,
                                        tool_call_id=call.id))
        info.update(tool_calls=len(calls.calls), tool_errors=errors)
        return messages

    # ------------------------------------------------------------------ scoring and info
    def evaluate(self, sparse: bool) -> float:
        if self.task.is_correct(self.final_answer):
            return 1.0
        if sparse:
            return 0.0
        return DENSE_TOOL_CREDIT if any(self.task.is_correct(value) for value in self.tool_values) else 0.0

    def info(self) -> dict[str, Any]:
        # The answer is deliberately absent: info is visible to the agent.
        return {**super().info(), "split": self.task.split, "level": self.task.level,
                "query": self.task.query, "max_steps": self.max_steps, "steps": self.steps,
                "terminated": self.terminated, "answered": self.answered, "final_answer": self.final_answer}


__all__ = ["DEFAULT_MAX_STEPS", "CalcEnv"]
