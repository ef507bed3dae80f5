"""``response_format`` -> a grammar every generated token must follow (structured outputs).

Why: the framework's LLM roles ask for JSON, and a small model writes it 0-20% of the time when only asked
(docs/llm_server.md, "Structured outputs"). Servers users run (vLLM, SGLang, hosted APIs) accept
``response_format: {"type": "json_schema", ...}`` and guarantee the shape by masking, at every step, the
tokens that cannot continue a valid reply; this module does the same for the local server with
`xgrammar <https://github.com/mlc-ai/xgrammar>`_, the library vLLM and SGLang use (chosen over llguidance by
measurement: ``bench/grammar_backends.py``).

What it does: check the requested schema (JSON Schema's own rules, then the keywords the grammar cannot
enforce), compile it once per distinct schema (in a worker thread, shared by concurrent requests; a schema
with string length limits takes ~1-3 s, a plain one milliseconds), and hand out one
:class:`GrammarConstraint` per generated choice, which the batched generator applies to that row only.
Replies are compact JSON (no optional whitespace), which keeps them short.

Every problem with a request is a 400 whose ``param`` starts with ``response_format`` and names the field.
Without the ``serve`` extra (``pip install 'agentevolver[serve]'``) JSON formats are answered with such a
400 too, which a client's ``auto`` structured-output switch reads as "not supported" and falls back from.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentevolver.llm_server.errors import ServerError
from agentevolver.schema.llm_wire import ResponseFormat

__all__ = ["UNSUPPORTED_KEYWORDS", "GrammarConstraint", "StructuredOutputs", "check_schema"]

logger = logging.getLogger(__name__)

#: JSON Schema keywords the grammar would silently ignore (measured on xgrammar 0.2.8): a schema using one
#: could get replies that do not validate, so it is refused instead.
UNSUPPORTED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "allOf", "dependentRequired", "dependentSchemas", "dependencies",
    "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
})

#: Keywords whose value is one subschema / a list of them / a name -> subschema map (where the walk goes).
_ONE = ("items", "additionalProperties", "propertyNames", "additionalItems")
_MANY = ("prefixItems", "anyOf", "oneOf")
_NAMED = ("properties", "patternProperties", "$defs", "definitions")

#: Distinct compiled schemas kept (oldest dropped first); roles send a handful.
CACHE_ENTRIES = 128

_XGRAMMAR_LOCATION = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
_SCHEMA_PARAM = "response_format.json_schema.schema"
#: A UTF-16 surrogate (U+D800-U+DFFF) written as UTF-8: the lead byte ED, then A0..BF (not valid UTF-8).
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


def check_schema(schema: Any, param: str = _SCHEMA_PARAM) -> None:
    """Raise a 400 naming the field (under ``param``, where the schema sits in the request) when ``schema`` is
    not a valid JSON Schema or uses a keyword the grammar cannot enforce (:data:`UNSUPPORTED_KEYWORDS`)."""
    import jsonschema

    if not isinstance(schema, dict):
        raise ServerError(400, f"{param} must be a JSON object (a JSON Schema); got "
                               f"{type(schema).__name__}", param=param)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        where = _dotted(param, err.absolute_path)
        raise ServerError(400, f"{where}: {err.message} (not a valid JSON Schema)", param=where) from None
    for path, keyword in _unsupported(schema, ()):
        where = _dotted(param, (*path, keyword))
        raise ServerError(
            400, f"{where}: the JSON Schema keyword {keyword!r} is not supported by this server's constrained "
                 f"decoding (it would not be enforced); unsupported: {', '.join(sorted(UNSUPPORTED_KEYWORDS))}",
            param=where,
        )


def _unsupported(schema: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path, keyword) of every unsupported keyword in ``schema`` and its subschemas."""
    if not isinstance(schema, dict):
        return
    for keyword in schema:
        if keyword in UNSUPPORTED_KEYWORDS:
            yield path, keyword
    for keyword in _ONE:
        if isinstance(schema.get(keyword), dict):
            yield from _unsupported(schema[keyword], (*path, keyword))
    for keyword in _MANY:
        for index, sub in enumerate(schema.get(keyword) or []):
            yield from _unsupported(sub, (*path, keyword, index))
    for keyword in _NAMED:
        for name, sub in (schema.get(keyword) or {}).items():
            yield from _unsupported(sub, (*path, keyword, name))


#: Oldest xgrammar whose masks this server was tested with (0.2.3, the version vLLM 0.24 pins, failed the
#: temperature-1.0 schema test with rows that allowed no token).
MIN_XGRAMMAR = (0, 2, 8)


def _version(package: str) -> tuple[int, ...]:
    from importlib.metadata import version

    return tuple(int(part) for part in re.findall(r"\d+", version(package))[:3])


def _dotted(prefix: str, parts: Sequence[Any]) -> str:
    return ".".join([prefix, *(str(part) for part in parts)])


class GrammarConstraint:
    """One row's grammar state: masks the tokens that cannot continue a valid reply, and advances.

    Besides the grammar it bans two kinds of token the grammar lets through (:class:`_ByteBans`):
    - every token whose text holds a raw control character (U+0000-U+001F): compact JSON never needs one (a
      newline in a string is written ``\\n``), and xgrammar 0.2.8's rule for length-limited strings lets them
      through, which would make ``json.loads`` reject the reply;
    - every token that would write a UTF-16 surrogate (U+D800-U+DFFF) as UTF-8 bytes (``ED A0..BF ..``), within
      the token or across two: xgrammar 0.2.8 counts one as a character, but it is not valid UTF-8, so the
      decoded reply holds three replacement characters instead and a string at its ``maxLength`` comes out
      two characters too long (a temperature-1.0 random model did this in CI).
    """

    def __init__(self, matcher: Any, xgr: Any, vocab_size: int, bans: _ByteBans) -> None:
        self._matcher = matcher
        self._xgr = xgr
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._bans = bans
        self._after_lead = False  # the reply's bytes so far end with ED, a lead byte whose second byte is pending

    def mask(self, scores: torch.Tensor) -> None:
        if self._matcher.is_terminated():
            return  # the reply is complete; the row ends on the EOS the grammar allowed
        self._matcher.fill_next_token_bitmask(self._bitmask, 0)
        row = scores.unsqueeze(0)
        self._xgr.apply_token_bitmask_inplace(row, self._bitmask)
        banned = self._bans.after_lead if self._after_lead else self._bans.always
        grammar_only = row.clone()
        scores.masked_fill_(banned, float("-inf"))
        if not bool(torch.isfinite(scores).any()):
            scores.copy_(grammar_only[0])  # never leave a row without a token to choose

    def accept(self, token: int) -> None:
        if self._matcher.is_terminated():
            return
        if not self._matcher.accept_token(token):
            logger.warning("structured output: the grammar rejected token %d it had allowed", token)
        if self._bans.has_bytes(token):  # a special token writes no byte and leaves a pending lead pending
            self._after_lead = token in self._bans.ends_with_lead


class _ByteBans:
    """The tokens :class:`GrammarConstraint` bans on top of the grammar, from each token's text and bytes.

    Args:
        token_texts: decoded text of every vocabulary id (for the control characters).
        token_bytes: the raw bytes each id writes (xgrammar's ``TokenizerInfo.decoded_vocab``; special tokens
            write none).
        special_ids: never banned.
        vocab_size: rows of the logits (ids past the tokenizer's are never banned).
    """

    #: The lead byte of U+D000-U+DFFF; a second byte of A0..BF makes it a surrogate.
    SURROGATE_LEAD = 0xED

    def __init__(self, token_texts: Sequence[str], token_bytes: Sequence[bytes], special_ids: frozenset[int],
                 vocab_size: int) -> None:
        def is_second(byte: int) -> bool:
            return 0xA0 <= byte <= 0xBF

        control, surrogate, starts_second, writes = [], [], [], []
        ends_with_lead = set()
        for i in range(vocab_size):
            special = i in special_ids
            text = token_texts[i] if i < len(token_texts) and not special else ""
            data = bytes(token_bytes[i]) if i < len(token_bytes) and not special else b""
            control.append(any(ord(ch) < 0x20 for ch in text))
            surrogate.append(_SURROGATE_BYTES.search(data) is not None)
            starts_second.append(bool(data) and is_second(data[0]))
            writes.append(bool(data))
            if data.endswith(bytes([self.SURROGATE_LEAD])):
                ends_with_lead.add(i)
        self.always = torch.tensor(control, dtype=torch.bool) | torch.tensor(surrogate, dtype=torch.bool)
        self.after_lead = self.always | torch.tensor(starts_second, dtype=torch.bool)
        self.ends_with_lead = frozenset(ends_with_lead)
        self._writes = writes

    def has_bytes(self, token: int) -> bool:
        """Whether ``token`` writes any byte (a special token leaves the pending-lead state as it was)."""
        return 0 <= token < len(self._writes) and self._writes[token]


class StructuredOutputs:
    """Grammars for one served model (its tokenizer and EOS ids); built lazily on the first JSON request.

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        vocab_size: rows of the model's logits (may exceed the tokenizer's length).
        stop_token_ids: the tokens that end a reply (the grammar allows them once the JSON is complete).
        token_texts: decoded text of every vocabulary id (the engine has it already).
        special_ids: special tokens, never banned (EOS is one).
    """

    def __init__(self, tokenizer: Any, *, vocab_size: int, stop_token_ids: Sequence[int],
                 token_texts: Sequence[str], special_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = list(stop_token_ids)
        self._token_texts = token_texts
        self._special_ids = special_ids
        self._compiler: Any = None
        self._xgr: Any = None
        self._bans: _ByteBans | None = None
        self._setup_lock = threading.Lock()
        self._cache: OrderedDict[str, asyncio.Future[Any]] = OrderedDict()
        self.stats = {"compiled": 0, "cache_hits": 0, "constrained_choices": 0, "rejected_formats": 0}

    async def grammar_for(self, response_format: ResponseFormat | None) -> Any | None:
        """The compiled grammar ``response_format`` asks for, or None for plain text; a 400 when refused."""
        if response_format is None or response_format.type == "text":
            return None
        if response_format.type == "json_object":
            return await self.grammar_for_schema({"type": "object"})
        assert response_format.json_schema is not None  # the request model requires it
        schema = response_format.json_schema.schema_
        try:
            check_schema(schema)
        except ServerError:
            self.stats["rejected_formats"] += 1
            raise
        return await self.grammar_for_schema(schema)

    async def grammar_for_schema(self, schema: dict[str, Any], param: str = _SCHEMA_PARAM) -> Any:
        """The compiled grammar of a checked JSON Schema (cached); a 400 naming ``param`` when it cannot be
        built. ``response_format`` and a forced ``tool_choice`` (:mod:`.forced_calls`) both come here."""
        key = json.dumps(schema)  # property order is kept: it is the order the reply writes the fields in
        future = self._cache.get(key)
        if future is not None and not (future.done() and future.exception() is not None):
            self._cache.move_to_end(key)
            self.stats["cache_hits"] += 1
            return await asyncio.shield(future)
        future = asyncio.ensure_future(asyncio.to_thread(self._compile, key, param))
        self._cache[key] = future
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        try:
            grammar = await asyncio.shield(future)
        except ServerError:
            self._cache.pop(key, None)
            self.stats["rejected_formats"] += 1
            raise
        self.stats["compiled"] += 1
        return grammar

    def constraint(self, grammar: Any) -> GrammarConstraint:
        """A fresh per-choice state for ``grammar`` (a matcher serves one sequence)."""
        assert self._xgr is not None and self._bans is not None
        self.stats["constrained_choices"] += 1
        return GrammarConstraint(self._xgr.GrammarMatcher(grammar), self._xgr, self._vocab_size, self._bans)

    # -- worker thread -------------------------------------------------------------------------------------

    def _compile(self, schema_json: str, param: str = _SCHEMA_PARAM) -> Any:
        compiler = self._ensure_compiler()
        try:
            return compiler.compile_json_schema(schema_json, any_whitespace=False)
        except RuntimeError as err:  # xgrammar reports what it cannot build as RuntimeError("[time] file:line: why")
            reason = _XGRAMMAR_LOCATION.sub("", str(err).strip())
            raise ServerError(400, f"{param}: this server cannot build a grammar from the schema: {reason}",
                              param=param) from None

    def _ensure_compiler(self) -> Any:
        with self._setup_lock:
            if self._compiler is None:
                try:
                    import xgrammar
                except ImportError:
                    raise ServerError(
                        400, "response_format json_object / json_schema (and tool_choice 'required' or a named "
                             "function) need the grammar library of the 'serve' extra, which is not installed on "
                             "this server (pip install 'agentevolver[serve]'); send response_format {'type': 'text'} "
                             "or leave it out (tool_choice: 'auto')",
                        param="response_format",
                    ) from None
                found = _version("xgrammar")
                if found < MIN_XGRAMMAR:
                    raise ServerError(
                        400, f"response_format json_object / json_schema needs xgrammar >= "
                             f"{'.'.join(map(str, MIN_XGRAMMAR))} on this server (found {'.'.join(map(str, found))}, "
                             "whose masks produced rows with no allowed token in our tests; vLLM pins it on GPU "
                             "machines, where vLLM itself should serve the roles); send response_format "
                             "{'type': 'text'} or leave it out",
                        param="response_format",
                    )
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self._vocab_size, stop_token_ids=self._stop_ids)
                self._bans = _ByteBans(self._token_texts, [bytes(b) for b in info.decoded_vocab],
                                       self._special_ids, self._vocab_size)
                self._xgr = xgrammar
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=2)
            return self._compiler
