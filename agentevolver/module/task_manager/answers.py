"""Reading an agent's final answer and matching it to a task's reference answer (the ``reference`` grader).

Why code and not an LLM: when the environment proved a synthetic task's answer (:mod:`.proof`), whether an
episode got it right is a comparison, and a small judge model has no signal on it (measured:
docs/task_manager.md). Numbers match within a tolerance (``rel_tol`` / ``abs_tol`` of the profile's
``answers``); other answers match after case and spacing are normalised.

The final answer is the text after the first ``final_answer_marker`` (default ``FINAL ANSWER``, matched
without regard to case, with an optional ``:`` / ``=`` / "is") in the agent's last message, as the ``calc``
environment reads it (a model cannot hedge with several answers); without the marker there is no answer. A number answer is the first number there ("FINAL ANSWER: $3,500 total" ->
3500).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from agentevolver.text_numbers import read_numbers

__all__ = ["AnswerMatch", "final_answer", "match_answer"]

_LEAD = re.compile(r"^\s*(?:is\b)?\s*[:=]?\s*(?:is\b)?[\s*$]*", re.IGNORECASE)


@dataclass(frozen=True)
class AnswerMatch:
    """Whether the agent's answer matches, and a short description for the episode's reward."""

    correct: bool
    description: str


def final_answer(text: str, marker: str = "FINAL ANSWER") -> str | None:
    """The text after the first ``marker`` in ``text`` (None when the marker is absent)."""
    pattern = re.compile(r"\s*".join(re.escape(word) for word in marker.split()), re.IGNORECASE)
    found = pattern.search(text)
    if found is None:
        return None
    rest = text[found.end():]
    return rest[_LEAD.match(rest).end():].strip()  # type: ignore[union-attr]


def match_answer(given: str | None, reference: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> AnswerMatch:
    """Compare the agent's answer with the reference: numerically when the reference is one number."""
    if given is None:
        return AnswerMatch(False, "no final answer")
    wanted = read_numbers(reference)
    if len(wanted) == 1:
        got = read_numbers(given)
        if not got:
            return AnswerMatch(False, f"answer {given[:40]!r} holds no number (reference {reference})")
        ok = math.isclose(got[0], wanted[0], rel_tol=rel_tol, abs_tol=abs_tol)
        return AnswerMatch(ok, f"answer {got[0]:.12g} {'matches' if ok else 'differs from'} reference {wanted[0]:.12g}")
    ok = _plain(given) == _plain(reference)
    return AnswerMatch(ok, f"answer {given[:40]!r} {'matches' if ok else 'differs from'} reference {reference[:40]!r}")


def _plain(text: str) -> str:
    return " ".join(text.casefold().strip(" .!").split())
