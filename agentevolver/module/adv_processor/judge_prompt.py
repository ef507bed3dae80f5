"""What the step judge reads and how its answer is read back: transcript -> prompt -> GOOD/BAD per step.

One prompt per sample holds the task, the outcome and every step (the agent's message and what the
environment answered), so one request labels the whole trajectory (seed 000 ch. 4: per-sample, not
per-step, calls). The judging rules follow the reference's intent: in a successful episode a step is GOOD
when it moved the task towards the result; in a failed one GOOD is reserved for steps that genuinely brought
the agent closer to a correct solution, and a step that finalises a wrong result is BAD.

The reply is parsed leniently but never guessed: numbered ``Step N Judgment: GOOD|BAD`` lines first (1- or
0-based, markdown tolerated), then, when the numbering is unusable, the judgments in order; anything that
does not give exactly one label per step raises :class:`JudgeParseError` (the caller retries, then falls
back to GRPO). When the judge's endpoint takes ``response_format`` (``structured=True``), the prompt asks for
``{"judgments": ["GOOD", "BAD", ...]}`` instead and :func:`judgment_schema` (exactly one label per step) is
sent with the request, so the reply always parses; what it cannot do is make a small judge right.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from agentevolver.client.structured_output import ReplySchema, reply_schema

__all__ = [
    "JudgeParseError",
    "StepText",
    "Transcript",
    "build_judge_messages",
    "clip_text",
    "judgment_schema",
    "outcome_success",
    "parse_step_judgments",
    "transcript_from_record",
]


class JudgeParseError(ValueError):
    """The judge's reply does not hold exactly one GOOD/BAD per step."""


@dataclass(frozen=True)
class StepText:
    """One step as the judge sees it: what the agent said/did, and what came back."""

    action: str
    observation: str


@dataclass(frozen=True)
class Transcript:
    """The text of one episode for the judge: the task and its steps (index j = step id j)."""

    task: str
    steps: tuple[StepText, ...]


#: Authors whose text is not the task itself: retrieved experience and context-manager notes.
_NOT_TASK_AUTHORS = {"experience", "memory"}
_AGENT_AUTHORS = {"llm", "llm(do_not_train)"}


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail (where answers and errors are)."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    keep = max(limit - len(marker), 2)
    head = keep * 2 // 3
    return text[:head] + marker + text[len(text) - (keep - head):]


def _render(message: Mapping[str, Any]) -> str:
    content = str(message.get("content") or "")
    calls = message.get("tool_calls") or []
    rendered = []
    for call in calls:
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        rendered.append(f"[tool call] {function.get('name', '?')}({arguments})")
    return "\n".join(part for part in [content, *rendered] if part)


def transcript_from_record(record: Mapping[str, Any], num_steps: int, max_message_chars: int) -> Transcript | None:
    """The judge's view of one episode from its dump record (``episode_record``; docs/rollout_dumps.md).

    Messages carry the ``step`` they belong to (-1 = before the first step): the task is the user text of
    step -1 (without injected experience or context-manager notes); step j is the agent's message(s) of step
    j and the environment/tool messages of step j. Returns None when the record has no messages.
    """
    messages = record.get("messages") or []
    if not messages:
        return None
    task_parts, actions, observations = [], [[] for _ in range(num_steps)], [[] for _ in range(num_steps)]
    for message in messages:
        step = message.get("step", -1)
        author = message.get("author", "")
        text = clip_text(_render(message), max_message_chars)
        if not text:
            continue
        if step is None or step < 0:
            if message.get("role") == "user" and author not in _NOT_TASK_AUTHORS:
                task_parts.append(text)
        elif step < num_steps:
            if message.get("role") == "assistant" or author in _AGENT_AUTHORS:
                actions[step].append(text)
            elif author not in _NOT_TASK_AUTHORS:
                observations[step].append(text)
    steps = tuple(StepText("\n".join(a) or "(no message recorded)", "\n".join(o) or "(nothing)")
                  for a, o in zip(actions, observations, strict=True))
    return Transcript(task="\n".join(task_parts) or "(task text not recorded)", steps=steps)


_SYSTEM = """You are a strict reviewer of an AI agent's work. The agent tried to solve a task in an \
environment, one step at a time: at each step it wrote a message (reasoning and/or an action or tool call) and \
the environment answered. You are told whether the episode succeeded. Judge every step as GOOD or BAD.

Rules:
- If the episode SUCCEEDED: a step is GOOD when it moved the task towards the result (found needed \
information, made a correct call, fixed an earlier mistake, gave the correct final answer); it is BAD when it \
was useless, repeated itself, made an error, or only worked by luck.
- If the episode FAILED: GOOD is reserved for steps that genuinely brought the agent closer to a correct \
solution; steps that made errors, went in circles, ignored what the environment said, or finalised a wrong \
result are BAD.
- Judge each step by what it did given what the agent knew at that point, not by the final outcome alone."""


_LINES_FORMAT = """Answer with exactly one line per step, in order, in this format and nothing else:
Step 1 Judgment: GOOD
Step 2 Judgment: BAD
(a reason of a few words may follow the label on the same line, after " - ")."""

_JSON_FORMAT = """Answer with a JSON object only, one label per step, in order: \
{"judgments": ["GOOD", "BAD", ...]}."""


class StepJudgments(BaseModel):
    """The structured judge reply: one label per step, in order."""

    judgments: list[Literal["GOOD", "BAD"]]


def judgment_schema(num_steps: int) -> ReplySchema:
    """The reply shape for ``num_steps`` steps: exactly that many GOOD/BAD labels."""
    return reply_schema(StepJudgments, "step_judgments", judgments={"minItems": num_steps, "maxItems": num_steps})


def build_judge_messages(transcript: Transcript, *, outcome: float, success: bool,
                         structured: bool = False) -> list[dict[str, str]]:
    """The chat messages of one judge request (system rules + the episode); ``structured`` asks for the JSON
    reply of :func:`judgment_schema` instead of ``Step N Judgment:`` lines."""
    count = len(transcript.steps)
    verdict = "SUCCEEDED" if success else "FAILED"
    parts = [f"## Task\n{transcript.task}", f"## Outcome\nThe episode {verdict} (reward {outcome:g}).",
             f"## Steps ({count})"]
    for number, step in enumerate(transcript.steps, start=1):
        parts.append(f"### Step {number}\nAgent:\n{step.action}\nEnvironment:\n{step.observation}")
    if structured:
        parts.append(f"Judge all {count} steps: a JSON object whose \"judgments\" list holds exactly {count} "
                     "labels, GOOD or BAD, step 1 first.")
    else:
        parts.append(f"Judge all {count} steps: exactly {count} lines, 'Step N Judgment: GOOD' or "
                     f"'Step N Judgment: BAD', N = 1..{count}.")
    system = _SYSTEM + "\n\n" + (_JSON_FORMAT if structured else _LINES_FORMAT)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


_THINK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_NUMBERED = re.compile(r"step\s*#?\s*(\d+)\b[^\w\n]*(?:judge?ment[^\w\n]*)?(good|bad)\b", re.IGNORECASE)
_LABELLED = re.compile(r"judge?ment[^\w\n]*(good|bad)\b", re.IGNORECASE)
_BARE = re.compile(r"\b(GOOD|BAD)\b")


def parse_step_judgments(reply: str, num_steps: int) -> list[bool]:
    """One bool per step (True = GOOD) from the judge's reply; :class:`JudgeParseError` if not exactly one each.

    Order of attempts: numbered judgments covering steps 1..K (or 0..K-1) without contradictions; then the
    ``Judgment: X`` labels in order if there are exactly K; then upper-case GOOD/BAD words in order if there
    are exactly K. A ``<think>`` block is ignored.
    """
    text = _THINK.sub("", reply)
    structured = _json_judgments(text)
    if structured is not None:
        if len(structured) == num_steps:
            return structured
        raise JudgeParseError(f"expected {num_steps} judgments in the JSON reply, found {len(structured)} in: "
                              f"{_excerpt(reply)}")
    numbered: dict[int, bool] = {}
    contradiction = False
    for match in _NUMBERED.finditer(text):
        number, good = int(match.group(1)), match.group(2).upper() == "GOOD"
        contradiction |= numbered.get(number, good) != good
        numbered[number] = good
    if not contradiction:
        for first in (1, 0):
            wanted = set(range(first, first + num_steps))
            if set(numbered) == wanted:
                return [numbered[n] for n in sorted(wanted)]
    for pattern in (_LABELLED, _BARE):
        labels = [m.group(1).upper() == "GOOD" for m in pattern.finditer(text)]
        if len(labels) == num_steps:
            return labels
    raise JudgeParseError(
        f"expected one GOOD/BAD judgment for each of {num_steps} step(s); found numbered steps "
        f"{sorted(numbered)[:12]}{' (contradictory)' if contradiction else ''}, "
        f"{len(_LABELLED.findall(text))} 'Judgment:' labels, {len(_BARE.findall(text))} bare labels "
        f"in: {_excerpt(reply)}")


def _json_judgments(text: str) -> list[bool] | None:
    """The labels of a ``{"judgments": [...]}`` reply; None when the reply is not one (read as lines)."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        return None
    labels = value.get("judgments") if isinstance(value, dict) else None
    if not isinstance(labels, list) or not all(isinstance(x, str) and x.upper() in ("GOOD", "BAD") for x in labels):
        return None
    return [label.upper() == "GOOD" for label in labels]


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def outcome_success(record: Mapping[str, Any] | None, outcome: float) -> bool:
    """Whether to tell the judge the episode succeeded: the record's ``success`` if known, else outcome > 0."""
    if record is not None and isinstance(record.get("success"), bool):
        return bool(record["success"])
    return outcome > 0

