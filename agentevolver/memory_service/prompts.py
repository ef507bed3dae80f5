"""What the LLM roles of the memory service are asked, and how their replies are read.

Five jobs, one system prompt each (the summariser's: success, failure and comparison extraction and
validation; the reranker's: rerank and rewrite). Every reply the code reads is JSON, because JSON is what
small models get right most often and what can be checked; the summariser sends the reply's schema
(:func:`extraction_schema`, :data:`VALIDATION_SCHEMA`) as ``response_format`` where the endpoint takes it,
and :func:`find_json` tolerates the usual wrapping of free-text replies (code fences, a sentence before, a
``<think>`` block) since a memory service should not lose an experience over formatting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from agentevolver.client.structured_output import ReplySchema, reply_schema
from agentevolver.schema.message import ChatMessage

__all__ = [
    "COMPARISON_SYSTEM",
    "FAILURE_SYSTEM",
    "RERANK_SYSTEM",
    "REWRITE_SYSTEM",
    "SUCCESS_SYSTEM",
    "VALIDATION_SCHEMA",
    "VALIDATION_SYSTEM",
    "Candidate",
    "cut",
    "extraction_schema",
    "find_json",
    "format_memories",
    "parse_experiences",
    "parse_ranking",
    "parse_validation",
    "render_trajectory",
    "task_text",
]

_FORMAT = (
    'Answer with a JSON object only, {{"experiences": [...]}}, with at most {n} items, each '
    '{{"when_to_use": "<the kind of task or situation this applies to, phrased so that it matches the '
    'description of a new task>", "experience": "<one concrete, actionable piece of advice>"}}. '
    "Write general advice that carries over to similar tasks, without this task's ids or literal values. "
    'Answer {{"experiences": []}} if nothing is worth keeping.'
)

SUCCESS_SYSTEM = (
    "You study a SUCCESSFUL attempt of an AI agent at a task and write down what made it work, as advice "
    "for future attempts at similar tasks. " + _FORMAT
)
FAILURE_SYSTEM = (
    "You study a FAILED attempt of an AI agent at a task and write down what went wrong and how to avoid "
    "it, as advice for future attempts at similar tasks. " + _FORMAT
)
COMPARISON_SYSTEM = (
    "You compare two attempts of an AI agent at the SAME task, a better one and a worse one, and write "
    "down the differences that explain the better result, as advice for future attempts at similar "
    "tasks. " + _FORMAT
)
VALIDATION_SYSTEM = (
    "You review a piece of advice distilled from an AI agent's past attempt at a task, before it is "
    "stored for reuse. Judge whether it is correct, actionable and general enough to help with similar "
    'future tasks. Answer with JSON only: {"score": <a number from 0 to 1>, "reason": "<one sentence>"}.'
)
RERANK_SYSTEM = (
    "You order stored experiences by how useful they are for a new task. Answer with a JSON array of the "
    "experience numbers only, most useful first, leaving out the ones that do not apply."
)
REWRITE_SYSTEM = (
    "You turn stored experiences into short advice for a new task: keep what applies to this task, merge "
    "overlapping points, and answer with the advice only, in plain sentences."
)

class _Experience(BaseModel):
    when_to_use: str = Field(json_schema_extra={"minLength": 1, "maxLength": 200})
    experience: str = Field(json_schema_extra={"minLength": 1, "maxLength": 400})


class _Experiences(BaseModel):
    experiences: list[_Experience]


class _Validation(BaseModel):
    score: float = Field(ge=0.0, le=1.0)
    reason: str = Field(json_schema_extra={"maxLength": 200})


def extraction_schema(limit: int) -> ReplySchema:
    """The extraction reply's shape: ``{"experiences": [...]}`` with at most ``limit`` items."""
    return reply_schema(_Experiences, "experiences", experiences={"maxItems": limit})


#: The validation reply's shape: ``{"score": 0..1, "reason": ...}``.
VALIDATION_SCHEMA = reply_schema(_Validation, "validation")

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Candidate:
    """An experience the LLM proposed, before validation."""

    when_to_use: str
    content: str


def cut(text: str, limit: int) -> str:
    """Keep the head and the tail of a long text (where task statements and final answers are)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]} [... {len(text) - limit} characters cut ...] {text[-tail:]}"


def _render_message(index: int, message: ChatMessage, limit: int) -> str:
    parts = [message.content.strip()] if message.content.strip() else []
    for call in message.tool_calls or []:
        parts.append(f"(calls tool {call.function.name} with {call.function.arguments})")
    label = message.role if not message.name else f"{message.role} {message.name}"
    return f"[{index}] {label}: {cut(' '.join(parts) or '(empty)', limit)}"


def render_trajectory(messages: Sequence[ChatMessage], *, max_chars: int, max_message_chars: int) -> str:
    """An episode as numbered lines, at most ``max_chars`` long.

    System messages (often long tool specifications) get a quarter of the per-message budget. When the
    whole is still too long, messages are dropped from the middle: the start says what the task was, the
    end how it went, and both matter more to a summary than the middle.
    """
    lines = []
    for i, message in enumerate(messages):
        limit = max_message_chars // 4 if message.role == "system" else max_message_chars
        lines.append(_render_message(i, message, max(limit, 100)))
    total = sum(len(line) + 1 for line in lines)
    if total <= max_chars:
        return "\n".join(lines)
    keep_head = min(3, len(lines))
    head, rest = lines[:keep_head], lines[keep_head:]
    budget = max_chars - sum(len(line) + 1 for line in head) - 60
    tail: list[str] = []
    for line in reversed(rest):
        if budget - (len(line) + 1) < 0:
            break
        tail.insert(0, line)
        budget -= len(line) + 1
    omitted = len(rest) - len(tail)
    marker = [f"[... {omitted} messages omitted ...]"] if omitted else []
    return cut("\n".join([*head, *marker, *tail]), max_chars)


def task_text(messages: Sequence[ChatMessage]) -> str:
    """The task an episode worked on: its first user message (the last one for a retrieval query)."""
    for message in messages:
        if message.role == "user" and message.content.strip():
            return message.content.strip()
    return ""


def find_json(text: str) -> Any | None:
    """The first JSON array or object in an LLM reply (fenced or bare), or None."""
    text = _THINK.sub("", text)
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for chunk in candidates:
        for start, char in enumerate(chunk):
            if char not in "[{":
                continue
            try:
                value, _ = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError:
                continue
            return value
    return None


def parse_experiences(text: str, limit: int) -> list[Candidate] | None:
    """Experiences from an extraction reply; None when the reply holds no readable JSON array."""
    value = find_json(text)
    if isinstance(value, dict):  # {"experiences": [...]} or a single experience
        value = next((v for v in value.values() if isinstance(v, list)), [value])
    if not isinstance(value, list):
        return None
    found: list[Candidate] = []
    for item in value:
        if not isinstance(item, dict):
            continue
        when = item.get("when_to_use") or item.get("condition") or ""
        content = item.get("experience") or item.get("content") or item.get("advice") or ""
        if isinstance(when, str) and isinstance(content, str) and content.strip():
            found.append(Candidate(when_to_use=when.strip() or content.strip(), content=content.strip()))
    return found[:limit]


def parse_validation(text: str) -> tuple[float, str] | None:
    """``(score in 0..1, reason)`` from a validation reply; None when unreadable."""
    value = find_json(text)
    if isinstance(value, dict) and isinstance(value.get("score"), int | float) and not isinstance(
        value.get("score"), bool
    ):
        reason = value.get("reason")
        return min(1.0, max(0.0, float(value["score"]))), reason if isinstance(reason, str) else ""
    return None


def parse_ranking(text: str, count: int) -> list[int] | None:
    """0-based candidate positions from a rerank reply (numbers are 1-based there); None when unreadable."""
    value = find_json(text)
    if not isinstance(value, list):
        return None
    order: list[int] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and 1 <= item <= count and item - 1 not in order:
            order.append(item - 1)
    return order


def format_memories(memories: Sequence[Any]) -> str:
    """Retrieved experiences as the text injected into a prompt ("" when there are none)."""
    blocks = [
        f"Experience {i} (applies when: {memory.when_to_use})\n{memory.content}"
        for i, memory in enumerate(memories, start=1)
    ]
    return "\n\n".join(blocks)


def numbered_candidates(memories: Sequence[Any]) -> str:
    """Candidates for the rerank/rewrite prompts, numbered from 1."""
    return "\n".join(
        f"{i}. applies when: {memory.when_to_use} | experience: {memory.content}"
        for i, memory in enumerate(memories, start=1)
    )
