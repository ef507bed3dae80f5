"""Tasks ``calc`` writes from an exploration (capability ``task_writing``, ``POST /task_writing``).

Each successful calculator or unit-converter call the explorer made becomes a question at one of calc's levels,
its observed result the answer and the call the evidence; the task manager still proves each one
(:mod:`agentevolver.module.task_manager.env_writer`). Every task records its level (``RenderedTask.level``):

* ``single`` / ``chain``: the expression restated ("What is 17 * 23?"; two or more operations are a chain);
* ``chain`` also from two dependent calls: a call on an earlier call's result ("12 + 5" -> 17, then "17 * 3")
  reads as one two-step question ("Add 12 and 5, then multiply the result by 3."), proved through both calls;
* ``word`` / ``distractor``: a story that tells one operation on two whole numbers
  (:mod:`env_service.environments.calc.stories`);
* ``convert``: a unit conversion ("How many meters are in 5 kilometers?").

Of the questions a call can be written as, one is picked by a digest of the call, so the same call always
reads the same (reproducible, and the dedup filter sees repeats as exact duplicates) while different calls
spread over the levels. With ``all_renderings`` every question of a call is a task, round by round: first the
digest pick of every call, then each call's next question, and so on, so a ``limit`` keeps the spread.
Expressions are written with one space around each binary operator (:func:`format_expression`), unit symbols
as words ("km" -> "kilometers"). What gives no task is counted:

* ``calls_failed``: the tool returned an error (a result starting with ``Error``) or not exactly one number;
* ``calls_not_rendered``: a tool with no question here, or a call lacking an argument its question needs;
* ``calls_merged``: the same call again in one exploration (one task, not two);
* ``seed_copies``: one of the call's renderings is the seed task's own question, word for word (the explorer
  solved the seed, and "Compute 65 - 59." would restate "What is 65 - 59?"). A word problem's arithmetic
  ("What is 12 * 5?" from a story about 12 muffins a day for 5 days) is a different question and is kept;
* ``over_limit``: beyond the request's ``limit`` (a question, not a call, with ``all_renderings``).
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentevolver.schema.task_writing import ObservedCall, RenderedTask, Rendering
from agentevolver.text_numbers import one_number
from env_service.environments.calc.stories import stories_for

__all__ = ["CALLS", "FAILURE_PREFIXES", "format_expression", "operations", "render_tasks"]

_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+|\*\*|[-+*/^×÷·−]|[()]|[^\s\d()]+")
_BINARY = {"+", "-", "*", "/", "**", "^", "×", "÷", "·", "−"}


@dataclass(frozen=True)
class CallRendering:
    """How a successful call of one tool reads as a question: ``str.format`` templates over its argument
    names, the arguments holding arithmetic, and the words that string argument values are written as
    (matched without regard to case; others stay as given)."""

    templates: tuple[str, ...]
    expressions: tuple[str, ...] = ()
    words: Mapping[str, str] = field(default_factory=dict)
    #: the level of a question restating the call (None: by the expression's operations, single or chain)
    level: str | None = None

    def fields(self) -> set[str]:
        """The argument names the templates use."""
        return {name for template in self.templates
                for _text, name, _spec, _conv in string.Formatter().parse(template) if name}


_UNIT_WORDS = {
    "mm": "millimeters", "cm": "centimeters", "m": "meters", "km": "kilometers", "in": "inches", "ft": "feet",
    "yd": "yards", "mi": "miles", "mg": "milligrams", "g": "grams", "kg": "kilograms", "lb": "pounds",
    "lbs": "pounds", "oz": "ounces", "s": "seconds", "sec": "seconds", "min": "minutes", "h": "hours",
    "hr": "hours", "day": "days", "week": "weeks", "ml": "milliliters", "l": "liters", "gal": "gallons",
    "c": "degrees Celsius", "f": "degrees Fahrenheit", "k": "kelvin",
}

#: The tools whose calls become questions, and how.
CALLS: Mapping[str, CallRendering] = {
    "calculator": CallRendering(
        templates=("What is {expression}?", "Calculate {expression}.", "Compute {expression}.",
                   "What is the value of {expression}?"),
        expressions=("expression",)),
    "convert_units": CallRendering(
        templates=("How many {to_unit} are in {value} {from_unit}?", "Convert {value} {from_unit} to {to_unit}.",
                   "What is {value} {from_unit} in {to_unit}?"),
        words=_UNIT_WORDS, level="convert"),
}
#: A tool result starting with one of these (case aside) is a failed call (calc's tools answer errors so).
FAILURE_PREFIXES = ("Error",)


def format_expression(text: str) -> str:
    """An arithmetic expression as calc's own tasks write it: one space around each binary operator, none
    inside parentheses or after a sign ("12*(3+4)" -> "12 * (3 + 4)", "-5+3" -> "-5 + 3"); a trailing ``=``
    is dropped (the calculator ignores it too)."""
    out: list[str] = []
    previous = ""  # "", "value", "operator", "(" or ")"
    for token in _TOKEN.findall(text.strip().rstrip("=").strip()):
        if token in ("+", "-", "−") and previous in ("", "operator", "("):
            out.append(token)  # a sign, written against its number
            previous = "operator"
        elif token in _BINARY:
            out.append(f" {token} ")
            previous = "operator"
        else:
            out.append(token)
            previous = token if token in "()" else "value"
    return "".join(out).strip()


def operations(expression: str) -> int:
    """Binary operators in ``expression`` as :func:`format_expression` writes it (a sign is none)."""
    return sum(1 for part in format_expression(expression).split(" ") if part in _BINARY)


def render_tasks(calls: Sequence[ObservedCall], *, seed_query: str | None = None,
                 limit: int | None = None, all_renderings: bool = False) -> Rendering:
    """Each successful, renderable call of ``calls`` (in order) -> a task, or with ``all_renderings`` every
    question it can be written as (see the module docstring)."""
    per_call: list[list[RenderedTask]] = []  # each call's questions, its digest pick first
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    results: dict[str, tuple[str, ObservedCall]] = {}  # an earlier one-operation call's result -> its expression
    failures = tuple(prefix.casefold() for prefix in FAILURE_PREFIXES)
    seed_text = _plain(seed_query) if seed_query else None
    for obs in calls:
        counts["calls_seen"] += 1
        result = obs.text.strip()
        answer = one_number(result)
        if not result or result.casefold().startswith(failures) or answer is None:
            counts["calls_failed"] += 1
            continue
        how = CALLS.get(obs.tool)
        values = _argument_values(obs.arguments, how) if how is not None else None
        if how is None or values is None or not how.fields() <= values.keys():
            counts["calls_not_rendered"] += 1
            continue
        key = json.dumps([obs.tool, sorted((k, v) for k, v in values.items() if k in how.fields())])
        if key in seen:
            counts["calls_merged"] += 1
            continue
        seen.add(key)
        restated = [template.format(**values) for template in how.templates]
        if seed_text is not None and any(_plain(text) == seed_text for text in restated):
            counts["seed_copies"] += 1
            continue
        digest = int(hashlib.sha256(key.encode()).hexdigest(), 16)
        choices = _questions(how, values, restated[digest % len(restated)], results)
        pick = (digest // len(restated)) % len(choices)
        ordered = [choices[pick]] + ([c for i, c in enumerate(choices) if i != pick] if all_renderings else [])
        if "expression" in values and operations(values["expression"]) == 1:
            results.setdefault(answer, (values["expression"], obs))
        own = []
        for level, query, evidence in ordered:
            if seed_text is not None and _plain(query) == seed_text:
                counts["seed_copies"] += 1
                continue
            own.append(RenderedTask(query=query, answer=answer, evidence=f"{evidence}{obs.call} -> {result}",
                                    call=obs.call, level=level))
        per_call.append(own)
    rounds = max((len(own) for own in per_call), default=0)
    every = [own[index] for index in range(rounds) for own in per_call if index < len(own)]
    tasks = every if limit is None else every[:limit]
    if len(every) > len(tasks):
        counts["over_limit"] += len(every) - len(tasks)
    counts["tasks_rendered"] = len(tasks)
    return Rendering(tasks=tasks, counts=dict(counts))


def _questions(how: CallRendering, values: dict[str, str], restated: str,
               results: Mapping[str, tuple[str, ObservedCall]]) -> list[tuple[str, str, str]]:
    """Every ``(level, question, evidence before the call)`` the call can be written as: its restatement,
    then each story and the two-step chain it completes."""
    expression = values.get("expression")
    level = how.level or ("single" if expression is None or operations(expression) <= 1 else "chain")
    choices = [(level, restated, "")]
    if expression is None:
        return choices
    choices += [(story_level, story, "") for story_level, story in stories_for(expression)]
    chained = _chain(expression, results)
    if chained is not None:
        choices.append(chained)
    return choices


#: Two-step questions in words, by (first call's operation, second call's operation); the second call's left
#: operand is the first call's result. Other pairs read "What is (a op b) op c?".
_CHAINS: Mapping[tuple[str, str], str] = {
    ("+", "*"): "Add {a} and {b}, then multiply the result by {c}.",
    ("-", "*"): "Subtract {b} from {a}, then multiply the result by {c}.",
    ("*", "+"): "Multiply {a} by {b}, then add {c}.",
    ("*", "-"): "Multiply {a} by {b}, then subtract {c}.",
    ("+", "/"): "Add {a} and {b}, then divide the result by {c}.",
    ("*", "/"): "Multiply {a} by {b}, then divide the result by {c}.",
}


def _chain(expression: str, results: Mapping[str, tuple[str, ObservedCall]]) -> tuple[str, str, str] | None:
    """A call ``x op c`` whose ``x`` an earlier one-operation call ``a op1 b`` returned -> one chain question
    stating ``a``, ``b`` and ``c`` (proved through both calls), or None."""
    parts = expression.split(" ")
    if len(parts) != 3 or parts[1] not in _BINARY:
        return None
    left, operation, c = parts
    earlier = results.get(left)
    if earlier is None:
        return None
    first, first_call = earlier
    first_parts = first.split(" ")
    if len(first_parts) != 3:  # e.g. "(12 + 5)": no worded form, and the parenthesised one would nest oddly
        return None
    a, first_operation, b = first_parts
    template = _CHAINS.get((first_operation, operation))
    question = (template.format(a=a, b=b, c=c) if template is not None
                else f"What is ({first}) {operation} {c}?")
    return "chain", question, f"{first_call.call} -> {first_call.text.strip()}; "


def _argument_values(arguments: Any, how: CallRendering) -> dict[str, str] | None:
    """The call's arguments as the text a template shows (None when they are not a JSON object)."""
    if not isinstance(arguments, dict):
        return None
    words = {key.casefold(): value for key, value in how.words.items()}
    values: dict[str, str] = {}
    for name, value in arguments.items():
        if isinstance(value, bool) or value is None or isinstance(value, dict | list):
            continue
        if isinstance(value, int | float):
            text = f"{value:.12g}"
        else:
            text = " ".join(str(value).split())
            if name in how.expressions:
                text = format_expression(text)
            text = words.get(text.casefold(), text)
        if text:
            values[name] = text
    return values


def _plain(text: str) -> str:
    return " ".join(text.casefold().strip(" .?!").split())
