"""Step labels for ``calc`` episodes, from what the question requires (capability ``step_labels``).

A calc task knows its answer, its tolerance and a reference solution (one calculator call on an expression,
or one ``convert_units`` call), so the environment can judge every step of a finished episode exactly,
where a small LLM judge cannot (SmolLM2-135M as judge: no signal). Steps are agent turns, numbered as the
agent flow numbers them (:func:`agentevolver.schema.step_labels.split_steps`). Tool calls are read as
``/step`` reads them (``tool_calls``, else ``<tool_call>`` blocks in the text) and replayed with the
environment's own tools, so a label never depends on how the observation was rendered or clipped.

A step is GOOD when every call in it computes something the question asks for, and none is BAD:

* a tool call is GOOD when it succeeds, its result is the answer (within the task's tolerance) or an
  intermediate value of the reference solution (``14 + 9`` of ``(14 + 9) * 3``), and -- for a question
  solved by the calculator -- every number in its expression is one the question gives, a value of the
  reference solution, or an earlier tool result (so ``69 - 59`` for "What is 65 - 59?" is BAD even
  where the value would pass, as is ``60 - 54``); it is BAD when it fails, computes anything else, or
  repeats a result an earlier step already obtained (no progress);
* a ``FINAL ANSWER`` is GOOD when its number is correct; BAD when it is missing, or wrong -- the reason
  says whether it contradicts a correct tool result, repeats a wrong one, or has no tool result behind it;
* a message that is neither (the environment answers it with a nudge) is BAD; tool calls take precedence
  over a ``FINAL ANSWER`` in the same message, as in ``/step``.

The labels are refused (:class:`~env_service.base.CannotLabel`) when the messages do not hold the task's
question (a synthetic task played on this task id is labelled only when the request gives its question and
answer: :mod:`env_service.environments.calc.played_task`) or when a step
got tool results for calls its message does not show (a tool-call dialect other than ``tool_calls`` and
hermes text: send the message with its parsed ``tool_calls``).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentevolver.schema import ChatMessage, ToolCall
from agentevolver.schema.step_labels import AgentStep, StepLabel, split_steps
from env_service.actions import read_tool_calls
from env_service.base import CannotLabel
from env_service.environments.calc.answer import has_final_answer, parse_final_answer
from env_service.environments.calc.calculator import evaluate_expression, format_number, normalize_expression
from env_service.environments.calc.tasks import CalcTask
from env_service.environments.calc.tools import CALCULATOR, run_tool

__all__ = ["label_episode"]

_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
#: Values closer than this (relative to max(1, |v|)) are the same number (intermediates are exact).
_SAME = 1e-9


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_SAME, abs_tol=_SAME)


@dataclass
class _Ground:
    """What the question requires: the task, its intermediate values and the numbers a call may use."""

    task: CalcTask
    intermediates: list[float]
    allowed_numbers: list[float]
    by_calculator: bool
    obtained: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, task: CalcTask) -> _Ground:
        by_calculator = task.solution.get("name") == CALCULATOR
        intermediates: list[float] = []
        literals: list[float] = []
        if by_calculator:
            tree = ast.parse(normalize_expression(str(task.solution["arguments"]["expression"])), mode="eval")
            intermediates = [_value(node) for node in ast.walk(tree.body)
                             if isinstance(node, ast.BinOp) and node is not tree.body]
            literals = [_value(node) for node in ast.walk(tree.body) if isinstance(node, ast.Constant)]
        question = [float(match.group()) for match in _NUMBER.finditer(task.query.replace(",", ""))]
        return cls(task, intermediates, question + literals + intermediates, by_calculator)

    def required(self, value: float) -> bool:
        """Whether ``value`` is the answer or one of the reference solution's intermediate values."""
        return self.task.is_correct(value) or any(_same(value, v) for v in self.intermediates)

    def stray_numbers(self, expression: str) -> list[float]:
        """Numbers of ``expression`` that neither the question, the solution nor an earlier result gives."""
        try:
            tree = ast.parse(normalize_expression(expression), mode="eval")
        except (SyntaxError, ValueError, RecursionError):
            return []
        known = self.allowed_numbers + self.obtained
        return [value for node in ast.walk(tree) if isinstance(node, ast.Constant)
                and isinstance(node.value, int | float) and not isinstance(node.value, bool)
                for value in [float(node.value)] if not any(_same(value, k) for k in known)]


def _value(node: ast.AST) -> float:
    """The value of a sub-expression of a (trusted, generated) reference solution."""
    return float(evaluate_expression(ast.unparse(node)))


def _describe(call: ToolCall) -> str:
    return f"{call.function.name}({call.function.arguments})"


def _label_call(ground: _Ground, call: ToolCall) -> tuple[bool, str, float | None]:
    """(GOOD?, why, the call's result or None) for one tool call."""
    result = run_tool(call.function.name, call.function.arguments)
    shown = _describe(call)
    if result.value is None:
        return False, f"{shown} failed: {result.text}", None
    value = result.value
    if not ground.required(value):
        return False, f"{shown} = {format_number(value)} is not a value the question asks for", value
    if ground.by_calculator and call.function.name == CALCULATOR:
        try:
            expression = str(call.function.arguments_dict().get("expression", ""))
        except ValueError:
            expression = ""
        stray = ground.stray_numbers(expression)
        if stray:
            numbers = ", ".join(format_number(v) for v in stray)
            return False, f"{shown} uses {numbers}, which the question does not give", value
    if any(_same(value, v) for v in ground.obtained):
        return False, f"{shown} repeats a result an earlier step already obtained", value
    return True, f"{shown} = {format_number(value)} computes what the question needs", value


def _label_final(ground: _Ground, content: str) -> tuple[bool, str]:
    answer = parse_final_answer(content)
    if answer is None:
        return False, "FINAL ANSWER without a number"
    shown = format_number(answer)
    if ground.task.is_correct(answer):
        return True, f"final answer {shown} is correct"
    if any(ground.task.is_correct(v) for v in ground.obtained):
        return False, f"final answer {shown} contradicts the tool result, which was correct"
    if any(_same(answer, v) for v in ground.obtained):
        return False, f"final answer {shown} reports the result of a wrong calculation"
    if ground.obtained:
        return False, f"final answer {shown} ignores the tool results and is wrong"
    return False, f"final answer {shown} is wrong, with no tool result behind it"


def _label_step(ground: _Ground, step: AgentStep) -> StepLabel:
    if not step.actions:
        return StepLabel(step=step.index, label="BAD", reason="no agent message recorded for this step")
    verdicts: list[tuple[bool, str]] = []
    obtained: list[float] = []
    for action in step.actions:
        calls = read_tool_calls(action, step.index + 1)
        if calls.calls or calls.problems:
            for call in calls.calls:
                good, reason, value = _label_call(ground, call)
                verdicts.append((good, reason))
                if value is not None:
                    obtained.append(value)
            verdicts += [(False, f"unreadable tool call: {problem}") for problem in calls.problems]
        elif any(m.role == "tool" for m in step.observations):
            raise CannotLabel(
                f"step {step.index} got tool results, but its assistant message holds no tool call that calc can "
                "read (neither tool_calls nor <tool_call> blocks); send the message with its parsed tool_calls",
                field="messages")
        elif has_final_answer(action.content):
            verdicts.append(_label_final(ground, action.content))
        else:
            verdicts.append((False, "neither a tool call nor a final answer"))
    ground.obtained += obtained
    good = all(ok for ok, _ in verdicts)
    return StepLabel(step=step.index, label="GOOD" if good else "BAD", reason="; ".join(r for _, r in verdicts))


def _opening_end(task: CalcTask, messages: Sequence[ChatMessage]) -> int:
    """Where the episode starts when messages carry no ``step``: after the last user message holding the
    question (calc's opening repeats demonstration turns before it)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user" and task.query in messages[index].content:
            return index + 1
    return 0


def label_episode(task: CalcTask, messages: Sequence[ChatMessage]) -> list[StepLabel]:
    """GOOD/BAD for every agent step of a finished episode of ``task`` (rules: the module docstring)."""
    try:
        episode = split_steps(messages, opening_end=_opening_end(task, messages))
    except ValueError as err:
        raise CannotLabel(str(err), field="messages") from err
    if not any(m.role == "user" and task.query in m.content for m in episode.context):
        raise CannotLabel(
            f"the episode's opening messages do not hold the question of calc task {task.task_id!r} "
            f"({task.query!r}); a synthetic task played on this id is labelled when params.task gives its query "
            "and answer",
            field="messages")
    ground = _Ground.of(task)
    return [_label_step(ground, step) for step in episode.steps]
