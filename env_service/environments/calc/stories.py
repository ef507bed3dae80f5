"""Word problems calc's task writer tells about one observed calculator call (levels ``word`` and ``distractor``).

Why: a task writer that only restates the call ("What is 12 * 5?") trains the levels where the question holds
the expression; calc's harder levels are stories whose expression the agent must write itself. A call of one
operation on two whole numbers determines such a story completely: "a box holds 12 pencils; how many pencils
are in 5 boxes?" asks for 12 * 5, and the observed result is its answer. Stories state exactly the call's two
numbers (the task manager's proof rejects a question stating a number its answer's calls never used, so a
``distractor`` story here mentions units but no irrelevant number). The wording is calc's task writer's own,
not a copy of calc's task templates, so a rendered story is never one of calc's evaluation tasks by
construction (and the task manager also rejects any that would equal one: ``eval_overlap``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["STORIES", "Story", "stories_for"]

_ONE_OPERATION = re.compile(r"^(\d+) ([-+*/]) (\d+)$")
#: Operands a story states (counts of things: no zero, nothing a reader would not picture).
_SMALLEST, _LARGEST = 2, 100_000


@dataclass(frozen=True)
class Story:
    """One story: its level, the operation it tells, and its ``str.format`` template over ``a`` and ``b``."""

    level: str
    operation: str
    template: str


STORIES: tuple[Story, ...] = (
    Story("word", "*", "A box holds {a} pencils. How many pencils are in {b} such boxes?"),
    Story("word", "*", "A theater has {a} rows of {b} chairs. How many chairs does the theater have?"),
    Story("word", "+", "Sam read {a} pages on Saturday and {b} pages on Sunday. How many pages did he read over "
                       "the weekend?"),
    Story("word", "+", "A shop sold {a} red balloons and {b} blue balloons. How many balloons did it sell?"),
    Story("word", "-", "A jar held {a} marbles. Lea took out {b} of them. How many marbles are still in the jar?"),
    Story("word", "-", "A train carried {a} passengers and {b} got off at the first stop. How many passengers "
                       "stayed on the train?"),
    Story("word", "/", "{a} stamps are split evenly into {b} albums. How many stamps go into each album?"),
    Story("distractor", "*", "A cyclist rides {a} kilometers every day. How many kilometers does she ride in {b} "
                             "days?"),
    Story("distractor", "+", "A kettle holds {a} milliliters of water and {b} milliliters more are poured in. "
                             "How many milliliters of water are there now?"),
    Story("distractor", "-", "A sack of flour weighs {a} grams and {b} grams are used for bread. How many grams "
                             "of flour are left?"),
    Story("distractor", "/", "A {a}-meter ribbon is cut into {b} pieces of equal length. How many meters long is "
                             "each piece?"),
)


def stories_for(expression: str) -> list[tuple[str, str]]:
    """``(level, question)`` for every story that tells ``expression`` (as calc writes one: "12 * 5"); none when
    it is not one operation on two whole numbers a story can state (a difference must be positive, a quotient
    whole)."""
    match = _ONE_OPERATION.match(expression)
    if match is None:
        return []
    a, operation, b = int(match.group(1)), match.group(2), int(match.group(3))
    if not (_SMALLEST <= a <= _LARGEST and _SMALLEST <= b <= _LARGEST):
        return []
    if (operation == "-" and a <= b) or (operation == "/" and a % b):
        return []
    return [(story.level, story.template.format(a=a, b=b)) for story in STORIES if story.operation == operation]
