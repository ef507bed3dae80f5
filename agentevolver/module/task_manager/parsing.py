"""LLM replies -> validated values, with bounded retries that show the model its mistake.

Every role of the task manager (summariser, feasibility judge, grader) asks for JSON, and sends the reply's
schema (:func:`agentevolver.client.structured_output.reply_schema` of its pydantic model) so that an
endpoint that takes ``response_format`` generates only valid replies. Replies from endpoints that do not
are free text: models wrap JSON in prose or code fences, or get it wrong; :func:`extract_json` finds the
first JSON value in the text, the role's parse function validates it (pydantic), and :func:`ask_parsed`
re-asks up to ``retries`` times with the parse error appended to the conversation. A reply that never
parses is *counted* (``ParsedReply.failures``) and returned as ``value=None``: it never ends a generation
run. ``ParsedReply.structured`` counts the replies generated under a schema.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentevolver.client.structured_output import ReplySchema, reply_schema
from agentevolver.embedders import normalize_text
from agentevolver.module.task_manager.prompts import MASK, RETRY_FEEDBACK

__all__ = ["FeasibilityReply", "GroundedItem", "ParsedReply", "ReplyParseError", "SummaryItem", "aask_parsed",
           "ask_parsed", "extract_json", "parse_summary", "summary_schema"]

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


class _TaskText(BaseModel):
    """The task statement every summariser item has."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    query: str = Field(min_length=8, json_schema_extra={"maxLength": 200})

    @field_validator("query")
    @classmethod
    def _a_sentence_not_the_mask(cls, value: str) -> str:
        """A task is an instruction, not an identifier ("run_python") or the mask parroted back."""
        if MASK in value:
            raise ValueError(f"a task must not contain {MASK}")
        if len(value.split()) < MIN_QUERY_WORDS:
            raise ValueError(f"a task must be an instruction of at least {MIN_QUERY_WORDS} words")
        return value

    @field_validator("answer", mode="before", check_fields=False)
    @classmethod
    def _answer_as_text(cls, value: Any) -> Any:
        """Models write numeric or structured answers as JSON values; keep them as text."""
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)


class SummaryItem(_TaskText):
    """One task as the summariser writes it."""

    answer: Annotated[str, Field(json_schema_extra={"maxLength": 120})] | None = None
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)


class GroundedItem(_TaskText):
    """A task whose answer the environment's observations must prove (profile ``answers``): the answer is
    required, and ``evidence`` quotes the observation that shows it (the proof itself is checked by code,
    :mod:`.proof`)."""

    answer: str = Field(min_length=1, json_schema_extra={"maxLength": 40})
    evidence: str = Field(min_length=1, json_schema_extra={"maxLength": 80})


class _Tasks(BaseModel):
    tasks: list[SummaryItem]


class _GroundedTasks(BaseModel):
    tasks: list[GroundedItem]


def summary_schema(limit: int, grounded: bool) -> ReplySchema:
    """The summariser's reply shape: ``{"tasks": [...]}`` with 1..``limit`` items (grounded: query, answer,
    evidence; otherwise query, answer or null, confidence or null). Strings are length-limited in the
    schema only (not when parsing a free-text reply), so a constrained small model cannot ramble on."""
    model = _GroundedTasks if grounded else _Tasks
    return reply_schema(model, "grounded_tasks" if grounded else "tasks",
                        tasks={"minItems": 1, "maxItems": limit})


@dataclass
class SummaryParse:
    """Valid items of a summariser reply and the reasons the others were rejected."""

    items: list[SummaryItem]
    rejected: list[str] = field(default_factory=list)


def parse_summary(text: str, limit: int, forbidden: Sequence[str] = (), grounded: bool = False) -> SummaryParse:
    """A summariser reply -> up to ``limit`` valid items; :class:`ReplyParseError` if there is none.

    A list, or an object holding one under ``tasks``, is accepted. A reply cut off by ``max_tokens`` in the
    middle of the array still yields its complete objects. Invalid items, and items whose query is one of
    ``forbidden`` (the worked example's), are dropped and listed. ``grounded`` items need an answer and
    its evidence (:class:`GroundedItem`).
    """
    value = extract_json(text)
    if isinstance(value, Mapping):
        value = value.get("tasks") if "tasks" in value else list(_objects(text))
    if not isinstance(value, list):
        raise ReplyParseError("expected a JSON array of task objects")
    copied = {normalize_text(text) for text in forbidden}
    model = GroundedItem if grounded else SummaryItem
    items: list[SummaryItem] = []
    rejected: list[str] = []
    for index, raw in enumerate(value):
        try:
            item = model.model_validate(raw)
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
    reason: str = Field(default="", json_schema_extra={"maxLength": 200})


@dataclass
class ParsedReply(Generic[T]):
    """The outcome of :func:`ask_parsed`: the value (None if no reply parsed) and what it took."""

    value: T | None
    replies: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    last_text: str = ""
    structured: int = 0  # replies generated under the schema (response_format)
    format_fallbacks: int = 0  # replies the endpoint generated as free text after refusing the schema


def _conversation(messages: Sequence[Mapping[str, str]], failed: list[tuple[str, str]]) -> list[dict[str, str]]:
    out = [dict(m) for m in messages]
    for text, error in failed:
        out.append({"role": "assistant", "content": text})
        out.append({"role": "user", "content": RETRY_FEEDBACK.format(error=error)})
    return out


def ask_parsed(client: Any, messages: Sequence[Mapping[str, str]], parse: Callable[[str], T], retries: int,
               schema: ReplySchema | None = None, **chat_kwargs: Any) -> ParsedReply[T]:
    """Ask ``client`` (an :class:`~agentevolver.client.llm_client.LLMClient`) and parse the reply; on a
    :class:`ReplyParseError` (or a pydantic error) re-ask with the error shown, at most ``retries`` times.
    ``schema`` goes to the client, which sends it as ``response_format`` when the endpoint takes it."""
    result: ParsedReply[T] = ParsedReply(value=None)
    failed: list[tuple[str, str]] = []
    for _attempt in range(retries + 1):
        text = _count_reply(result, client.chat(_conversation(messages, failed), schema=schema, **chat_kwargs))
        try:
            result.value = parse(text)
            return result
        except (ReplyParseError, ValidationError) as err:
            _count_failure(result, failed, text, err)
    return result


async def aask_parsed(client: Any, messages: Sequence[Mapping[str, str]], parse: Callable[[str], T],
                      retries: int, schema: ReplySchema | None = None, **chat_kwargs: Any) -> ParsedReply[T]:
    """Async :func:`ask_parsed` (``client.achat``)."""
    result: ParsedReply[T] = ParsedReply(value=None)
    failed: list[tuple[str, str]] = []
    for _attempt in range(retries + 1):
        reply = await client.achat(_conversation(messages, failed), schema=schema, **chat_kwargs)
        text = _count_reply(result, reply)
        try:
            result.value = parse(text)
            return result
        except (ReplyParseError, ValidationError) as err:
            _count_failure(result, failed, text, err)
    return result


def _count_reply(result: ParsedReply[Any], reply: Any) -> str:
    """Count one reply (and whether it was structured); return its text."""
    result.replies += 1
    result.structured += bool(getattr(reply, "structured", None))
    result.format_fallbacks += bool(getattr(reply, "format_fallback", False))
    result.last_text = reply.text
    return reply.text


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
