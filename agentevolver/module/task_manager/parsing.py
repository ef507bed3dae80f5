"""LLM replies -> validated values, with bounded retries that show the model its mistake.

Every role of the task manager (summariser, feasibility judge, grader) asks for JSON. Models wrap it in
prose or code fences, or get it wrong; :func:`extract_json` finds the first JSON value in the text, the
role's parse function validates it against a schema (pydantic), and :func:`ask_parsed` re-asks up to
``retries`` times with the parse error appended to the conversation. A reply that never parses is
*counted* (``ParsedReply.failures``) and returned as ``value=None``: it never ends a generation run.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentevolver.module.task_manager.embedding import normalize_text
from agentevolver.module.task_manager.prompts import MASK, RETRY_FEEDBACK

__all__ = ["FeasibilityReply", "ParsedReply", "ReplyParseError", "SummaryItem", "aask_parsed", "ask_parsed",
           "extract_json", "parse_summary"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: Fewer words than this is not a task but a name or a fragment.
MIN_QUERY_WORDS = 3

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_DECODER = json.JSONDecoder()


class ReplyParseError(ValueError):
    """A reply that cannot be used; the message is shown to the model on retry, so it says what to fix."""


def extract_json(text: str) -> Any:
    """The first JSON array or object in ``text`` (inside a ```json fence if there is one)."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        for start, char in enumerate(candidate):
            if char in "[{":
                try:
                    value, _end = _DECODER.raw_decode(candidate, start)
                except json.JSONDecodeError:
                    continue
                return value
    raise ReplyParseError("it contains no JSON array or object")


class SummaryItem(BaseModel):
    """One task as the summariser writes it."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    query: str = Field(min_length=8)
    answer: str | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_as_text(cls, value: Any) -> Any:
        """Models write numeric or structured answers as JSON values; keep them as text."""
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)

    @field_validator("query")
    @classmethod
    def _a_sentence_not_the_mask(cls, value: str) -> str:
        """A task is an instruction, not an identifier ("run_python") or the mask parroted back."""
        if MASK in value:
            raise ValueError(f"a task must not contain {MASK}")
        if len(value.split()) < MIN_QUERY_WORDS:
            raise ValueError(f"a task must be an instruction of at least {MIN_QUERY_WORDS} words")
        return value


@dataclass
class SummaryParse:
    """Valid items of a summariser reply and the reasons the others were rejected."""

    items: list[SummaryItem]
    rejected: list[str] = field(default_factory=list)


def parse_summary(text: str, limit: int, forbidden: Sequence[str] = ()) -> SummaryParse:
    """A summariser reply -> up to ``limit`` valid items; :class:`ReplyParseError` if there is none.

    A list, or an object holding one under ``tasks``, is accepted. A reply cut off by ``max_tokens`` in the
    middle of the array still yields its complete objects. Invalid items, and items whose query is one of
    ``forbidden`` (the worked example's), are dropped and listed.
    """
    value = extract_json(text)
    if isinstance(value, Mapping):
        value = value.get("tasks") if "tasks" in value else list(_objects(text))
    if not isinstance(value, list):
        raise ReplyParseError("expected a JSON array of task objects")
    copied = {normalize_text(text) for text in forbidden}
    items: list[SummaryItem] = []
    rejected: list[str] = []
    for index, raw in enumerate(value):
        try:
            item = SummaryItem.model_validate(raw)
        except ValidationError as err:
            first = err.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"]) or "item"
            rejected.append(f"item {index}: {where}: {first['msg']}")
            continue
        if normalize_text(item.query) in copied:
            rejected.append(f"item {index}: copied from the example; write tasks for this environment")
            continue
        items.append(item)
    if not items:
        detail = f" ({'; '.join(rejected[:3])})" if rejected else ""
        raise ReplyParseError('no valid task object: each needs a "query" instruction of at least '
                              f'{MIN_QUERY_WORDS} words' + detail)
    return SummaryParse(items[:limit], rejected)


def _objects(text: str) -> Iterator[Any]:
    """Every complete top-level JSON object in ``text``, in order (salvages a truncated array)."""
    start = text.find("{")
    while start != -1:
        try:
            value, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        yield value
        start = text.find("{", end)


class FeasibilityReply(BaseModel):
    """The feasibility judge's verdict."""

    model_config = ConfigDict(extra="ignore")

    feasible: bool
    reason: str = ""


@dataclass
class ParsedReply(Generic[T]):
    """The outcome of :func:`ask_parsed`: the value (None if no reply parsed) and what it took."""

    value: T | None
    replies: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    last_text: str = ""


def _conversation(messages: Sequence[Mapping[str, str]], failed: list[tuple[str, str]]) -> list[dict[str, str]]:
    out = [dict(m) for m in messages]
    for text, error in failed:
        out.append({"role": "assistant", "content": text})
        out.append({"role": "user", "content": RETRY_FEEDBACK.format(error=error)})
    return out


def ask_parsed(client: Any, messages: Sequence[Mapping[str, str]], parse: Callable[[str], T], retries: int,
               **chat_kwargs: Any) -> ParsedReply[T]:
    """Ask ``client`` (an :class:`~agentevolver.client.llm_client.LLMClient`) and parse the reply; on a
    :class:`ReplyParseError` (or a pydantic error) re-ask with the error shown, at most ``retries`` times."""
    result: ParsedReply[T] = ParsedReply(value=None)
    failed: list[tuple[str, str]] = []
    for _attempt in range(retries + 1):
        text = client.chat(_conversation(messages, failed), **chat_kwargs).text
        result.replies += 1
        result.last_text = text
        try:
            result.value = parse(text)
            return result
        except (ReplyParseError, ValidationError) as err:
            _count_failure(result, failed, text, err)
    return result


async def aask_parsed(client: Any, messages: Sequence[Mapping[str, str]], parse: Callable[[str], T],
                      retries: int, **chat_kwargs: Any) -> ParsedReply[T]:
    """Async :func:`ask_parsed` (``client.achat``)."""
    result: ParsedReply[T] = ParsedReply(value=None)
    failed: list[tuple[str, str]] = []
    for _attempt in range(retries + 1):
        text = (await client.achat(_conversation(messages, failed), **chat_kwargs)).text
        result.replies += 1
        result.last_text = text
        try:
            result.value = parse(text)
            return result
        except (ReplyParseError, ValidationError) as err:
            _count_failure(result, failed, text, err)
    return result


def _count_failure(result: ParsedReply[Any], failed: list[tuple[str, str]], text: str, err: Exception) -> None:
    error = _short_error(err)
    result.failures += 1
    result.errors.append(error)
    failed.append((text, error))
    logger.debug("unparseable reply (%s): %r", error, text[:500])


def _short_error(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        return f"{where}: {first['msg']}"
    return str(err)
