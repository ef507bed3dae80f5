"""The task an episode on one of calc's task ids played, as ``/step_labels`` judges it.

A synthetic task (Self-Questioning) runs on its seed's task id with its own question in place of calc's
(:attr:`agentevolver.schema.task.TaskObjective.instance_task_id`): calc knows the id, not the question. So a
``/step_labels`` request may say what was asked, ``params.task = {"query": ..., "answer": ...}``, which the
trainer sends for every sample whose task is not the environment's own. calc then labels the episode
against that question and answer instead of its seed's (without ``params.task`` it labels against its own
task, and refuses an episode whose messages do not hold that task's question).

What calc cannot take on trust it works out itself: the answer must be one number, and the question's
arithmetic, where calc finds it (the longest expression written in the question whose value is the answer,
which is how calc's task writer renders a calculator call: "What is 39 * 13 - 8?"), becomes the reference
solution, so its sub-results count as the intermediate values a step may compute. A question without such
an expression (a word problem an LLM wrote, a unit conversion) is labelled against its answer and the
numbers it states only: a calculator step is GOOD when its result is the answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from agentevolver.text_numbers import one_number
from env_service.environments.calc.calculator import CalcError, evaluate_expression
from env_service.environments.calc.tasks import EXACT_TOLERANCE, CalcTask
from env_service.environments.calc.tools import CALCULATOR
from env_service.errors import EnvServiceError

__all__ = ["ANSWER_REL_TOLERANCE", "played_task", "question_expression"]

#: Relative tolerance of a given answer (the calc profile's ``answers.rel_tol``, which the reference grader
#: scores synthetic tasks with); never below calc's exact tolerance.
ANSWER_REL_TOLERANCE = 1e-6

#: Runs of characters an arithmetic expression is written with (digits, operators, brackets, spaces).
_ARITHMETIC_RUN = re.compile(r"[\d.,()+\-*/×÷^·−\s]+")
_OPERATOR = re.compile(r"\d\s*[-+*/×÷^·−]+\s*[\d(]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def question_expression(query: str, answer: float, tolerance: float) -> str | None:
    """The longest arithmetic expression written in ``query`` whose value is ``answer`` (within
    ``tolerance``), or None. Thousands separators are dropped; a run's trailing full stop is not a decimal."""
    found: list[str] = []
    for run in _ARITHMETIC_RUN.findall(query):
        text = _THOUSANDS.sub("", run).strip(" \t\n.,")
        if not _OPERATOR.search(text):
            continue
        try:
            value = float(evaluate_expression(text))
        except (CalcError, ValueError, ArithmeticError):
            continue
        if abs(value - answer) <= tolerance:
            found.append(text)
    return max(found, key=len) if found else None


def played_task(seed: CalcTask, params: Mapping[str, Any]) -> CalcTask:
    """The task the episode played: ``seed`` itself, or the task ``params["task"]`` defines on its id (see
    the module docstring). Raises :class:`EnvServiceError` (400, naming the field) for a malformed one."""
    definition = params.get("task")
    if definition is None:
        return seed
    if not isinstance(definition, Mapping):
        raise EnvServiceError(f"params.task must be an object with query and answer, got {type(definition).__name__}",
                              field="params.task")
    query = definition.get("query")
    if not isinstance(query, str) or not query.strip():
        raise EnvServiceError("params.task.query must be the question the episode was asked (a non-empty string)",
                              field="params.task.query")
    raw = definition.get("answer")
    number = one_number(str(raw)) if isinstance(raw, str | int | float) and not isinstance(raw, bool) else None
    if number is None:
        raise EnvServiceError(f"params.task.answer must be one number (calc labels numeric answers), got {raw!r}",
                              field="params.task.answer")
    answer = float(number.replace(",", ""))
    tolerance = max(EXACT_TOLERANCE, ANSWER_REL_TOLERANCE * abs(answer))
    expression = question_expression(query, answer, tolerance)
    solution: dict[str, Any] = ({"name": CALCULATOR, "arguments": {"expression": expression}} if expression
                                else {"name": "", "arguments": {}})
    return replace(seed, query=query, answer=answer, tolerance=tolerance, solution=solution)
