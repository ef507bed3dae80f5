"""Is a written task's answer proved by what the environment returned during the exploration?

Why: a synthetic task is only as good as the evidence for its answer, and a small task writer invents
answers (measured: 1-2 of 10 proved; docs/task_manager.md). Where the profile declares that observations
prove answers (``answers``, :class:`~agentevolver.module.task_manager.profile.AnswerProof`), each task the
writer proposes is checked here, by code, against the exploration's record; only proved tasks are kept,
and their answers are then trusted as ground truth by the ``reference`` grader.

Number answers (``kind: number``), checked in order, each failure with its reason code:

* ``answer_not_one_number``: the answer holds no number, or several (``"17 * 23 = 391"`` is not an answer);
* ``answer_in_query``: the query already states it (nothing to compute);
* ``answer_not_observed``: no tool result of the exploration equals it (``rel_tol`` / ``abs_tol``); the
  agent's own messages prove nothing, nor do the environment's worked examples (they precede the record);
* ``inputs_not_in_query`` (with ``inputs_in_query``): every tool result equal to it came from a call given
  a number that the query neither states nor can obtain from an earlier call whose own inputs it states;
  such a task could not be solved as written, or has another answer;
* ``query_numbers_unused`` (with ``inputs_in_query``): the query states a number that no call of the
  answer's derivation used, so it asks for something else ("what is 258 / 6 * 31?" is not answered by
  ``258 / 6`` = 43). Strict on purpose: a word problem with an irrelevant number is rejected too.

Text answers (``kind: text``): ``answer_not_observed`` unless the answer appears (case and spacing aside) in
an environment message of the record; ``answer_in_query`` as above. The writer's ``evidence`` is kept with
the task for people to read; the proof never relies on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentevolver.module.task_manager.profile import AnswerProof
from agentevolver.schema import ChatMessage, Trajectory
from agentevolver.text_numbers import read_numbers

__all__ = ["REJECTION_REASONS", "Observation", "Proof", "observations", "prove"]

#: Every reason code :func:`prove` gives for an unproved answer.
REJECTION_REASONS = ("answer_not_one_number", "answer_in_query", "answer_not_observed", "inputs_not_in_query",
                     "query_numbers_unused")


@dataclass(frozen=True)
class Observation:
    """One environment message of the exploration and, for a tool result, the call that produced it."""

    text: str
    call: str | None = None  # "name(arguments)" for people to read
    inputs: tuple[float, ...] = ()  # numbers the call was given
    tool: str | None = None  # the called tool's name (the environment writer renders by it)
    arguments: Any = None  # the call's arguments, parsed from JSON when they were a string


@dataclass(frozen=True)
class Proof:
    """The outcome for one answer: ``proved``, or the reason code (:data:`REJECTION_REASONS`) and why."""

    proved: bool
    reason: str = ""
    detail: str = ""
    observation: str | None = None
    call: str | None = None

    def metadata(self) -> dict[str, Any]:
        """What a kept task records about its proof."""
        return {"observation": self.observation, "call": self.call}


def observations(trajectory: Trajectory) -> list[Observation]:
    """The environment's messages after the opening (tool results paired with their calls), in order."""
    opening = int(trajectory.metadata.get("opening_len", 0))
    found: list[Observation] = []
    pending: list[Any] = []
    for message in trajectory.messages[opening:]:
        if message.role == "assistant":
            pending = list(message.tool_calls or [])
        elif message.role == "tool":
            call = _take_call(pending, message)
            found.append(Observation(message.content, *_describe(call)) if call else Observation(message.content))
        elif message.role == "user":
            found.append(Observation(message.content))
    return found


def prove(query: str, answer: str, record: Sequence[Observation], rules: AnswerProof) -> Proof:
    """Check one task's ``answer`` against the exploration's ``record`` (see the module docstring)."""
    if rules.kind == "text":
        return _prove_text(query, answer, record)
    found = read_numbers(answer)
    if len(found) != 1:
        return Proof(False, "answer_not_one_number", f"the answer {answer!r} holds {len(found)} numbers, not one")
    value = found[0]
    close = _closeness(rules)
    if any(close(value, n) for n in read_numbers(query, signed=False)):
        return Proof(False, "answer_in_query", f"the query already states {_fmt(value)}")
    results = [obs for obs in record if obs.call is not None]
    matches = [obs for obs in results if any(close(value, n) for n in read_numbers(obs.text))]
    if not matches:
        return Proof(False, "answer_not_observed", f"no tool result of the exploration equals {_fmt(value)}")
    if not rules.inputs_in_query:
        return Proof(True, observation=matches[0].text, call=matches[0].call)
    stated = read_numbers(query, signed=False)
    derived = [(obs, chain) for obs in matches
               if (chain := _derivation(results.index(obs), results, stated, close, set())) is not None]
    if not derived:
        obs = matches[0]
        missing = sorted({_fmt(x) for x in obs.inputs if not any(close(x, n) for n in stated)})
        return Proof(False, "inputs_not_in_query",
                     f"{obs.call} gave {_fmt(value)}, but the query does not state {', '.join(missing)}")
    for obs, chain in derived:
        used = [x for step in chain for x in step.inputs]
        if all(any(close(n, x) for x in used) for n in stated):
            return Proof(True, observation=obs.text, call=" -> ".join(str(step.call) for step in chain))
    obs, chain = derived[0]
    used = [x for step in chain for x in step.inputs]
    unused = sorted({_fmt(n) for n in stated if not any(close(n, x) for x in used)})
    return Proof(False, "query_numbers_unused",
                 f"the query states {', '.join(unused)}, which computing {_fmt(value)} with {obs.call} never used")


def _derivation(index: int, results: Sequence[Observation], stated: Sequence[float], close: Any,
                visiting: set[int]) -> list[Observation] | None:
    """The calls that compute ``results[index]`` from the query's numbers, in order (it last): each input is
    stated, or the result of an earlier call with a derivation of its own. None when there is none."""
    if index in visiting:
        return None
    visiting = visiting | {index}
    chain: list[Observation] = []
    for x in results[index].inputs:
        if any(close(x, n) for n in stated):
            continue
        for earlier in range(index - 1, -1, -1):
            if any(close(x, abs(v)) for v in read_numbers(results[earlier].text)):
                sub = _derivation(earlier, results, stated, close, visiting)
                if sub is not None:
                    chain += [step for step in sub if step not in chain]
                    break
        else:
            return None
    return [*chain, results[index]]


def _prove_text(query: str, answer: str, record: Sequence[Observation]) -> Proof:
    wanted = _plain(answer)
    if not wanted:
        return Proof(False, "answer_not_observed", "the answer is empty")
    if wanted in _plain(query):
        return Proof(False, "answer_in_query", "the query already states the answer")
    for obs in record:
        if wanted in _plain(obs.text):
            return Proof(True, observation=obs.text, call=obs.call)
    return Proof(False, "answer_not_observed", f"no environment message of the exploration contains {answer!r}")


def _take_call(pending: list[Any], message: ChatMessage) -> Any:
    """The call a tool message answers: by id when it has one that matches, else the next in order."""
    for index, call in enumerate(pending):
        if message.tool_call_id and call.id == message.tool_call_id:
            return pending.pop(index)
    return pending.pop(0) if pending else None


def _describe(call: Any) -> tuple[str, tuple[float, ...], str, Any]:
    """``(shown call, numbers it was given, tool name, parsed arguments)`` of one tool call."""
    arguments = call.function.arguments
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        parsed = arguments
    inputs = tuple(_walk_numbers(parsed))
    shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f"{call.function.name}({shown})", inputs, call.function.name, parsed


def _walk_numbers(value: Any) -> Iterator[float]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        yield abs(float(value))
    elif isinstance(value, str):
        yield from read_numbers(value, signed=False)  # operands: "17 - 5" gives 17 and 5
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk_numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk_numbers(item)


def _closeness(rules: AnswerProof) -> Any:
    def close(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=rules.rel_tol, abs_tol=rules.abs_tol)

    return close


def _plain(text: str) -> str:
    return " ".join(text.casefold().split())


def _fmt(value: float) -> str:
    return f"{value:.12g}"
