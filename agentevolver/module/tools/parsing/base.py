"""The parser contract, the result it returns, and the registry that picks a parser by config name.

A parser turns one assistant message (decoded text, or the generated token ids plus the tokenizer) into a
:class:`ParsedAction`. Malformed blocks never raise: they are listed in ``ParsedAction.errors`` so the agent
flow can show them to the model as an observation and let it repair the call, instead of ending the episode
or, worse, silently treating a broken call as "no call" (seed 001, section 17.4).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentevolver.errors import ConfigError
from agentevolver.registry import Registry
from agentevolver.schema.message import ToolCall

__all__ = [
    "PARSERS",
    "ParsedAction",
    "ToolCallParser",
    "assign_call_ids",
    "build_parser",
    "call_id",
    "get_parser",
    "parser_names",
    "register_parser",
]

logger = logging.getLogger(__name__)

#: One tool schema as the prompt carries it (OpenAI function format); parsers may use it to type values.
ToolSchema = Mapping[str, Any]


@dataclass
class ParsedAction:
    """What one assistant message asks for.

    ``content`` is the text outside every recognised block (whitespace-trimmed; pieces joined by newlines),
    ``tool_calls`` the well-formed calls in message order, ``final_answer`` the text after a final-answer
    marker (None when there is none), and ``errors`` one line per malformed block, worded for the model.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    final_answer: str | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def has_action(self) -> bool:
        """True when the message asks for something: a call, a final answer, or a broken attempt at one."""
        return bool(self.tool_calls or self.final_answer is not None or self.errors)


def call_id(step: int, index: int) -> str:
    """Id of the ``index``-th call of the message generated at episode step ``step``.

    Deterministic (no uuid), so that rendering the same episode twice gives the same tokens.
    """
    return f"call_{step}_{index}"


def assign_call_ids(calls: Sequence[ToolCall], step: int) -> list[ToolCall]:
    """Give every call without an id the positional id :func:`call_id` (``call_<step>_<i>``).

    Ids the model wrote itself are kept, except when two calls of the message share one: the later one gets
    its positional id, because tool messages are matched to calls by id and must not be ambiguous.
    """
    seen: set[str] = set()
    out: list[ToolCall] = []
    for index, call in enumerate(calls):
        new_id = call.id if call.id and call.id not in seen else call_id(step, index)
        seen.add(new_id)
        out.append(call if new_id == call.id else call.model_copy(update={"id": new_id}))
    return out


class ToolCallParser(ABC):
    """Base of every parser: implement :meth:`extract`; callers use :meth:`parse` or :meth:`parse_ids`.

    ``extract`` returns calls with the ids the model wrote (often none); :meth:`parse` then fills in
    positional ids, so composite parsers can merge the calls of their parts before numbering them.
    """

    #: The name it is registered under (set by :func:`register_parser`).
    name: str = ""
    #: Special tokens (text) at which generation must stop so the calls can run: some models end a call
    #: with a token that is not their end-of-sequence and would otherwise go on writing the tool's answer
    #: themselves (Gemma 4's ``<tool_call|>``, GLM's ``<|observation|>``). :meth:`stop_token_ids` turns them
    #: into ids for the rollout's ``stop_token_ids``.
    stop_tokens: tuple[str, ...] = ()

    @abstractmethod
    def extract(self, text: str, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """Find this parser's blocks in ``text``; calls may have empty ids."""

    def parse(self, text: str, *, step: int = 0, tools: Sequence[ToolSchema] | None = None) -> ParsedAction:
        """Parse one decoded assistant message generated at episode step ``step``."""
        action = self.extract(text, tools)
        action.tool_calls = assign_call_ids(action.tool_calls, step)
        if action.errors:
            logger.debug("parser %s: %d malformed block(s): %s", self.name, len(action.errors), action.errors)
        return action

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        """Ids of :attr:`stop_tokens` that ``tokenizer`` has as single tokens (others are skipped)."""
        ids: list[int] = []
        for token in self.stop_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            unknown = getattr(tokenizer, "unk_token_id", None)
            if isinstance(token_id, int) and token_id >= 0 and token_id != unknown and token_id not in ids:
                ids.append(token_id)
        return ids

    def parse_ids(
        self,
        token_ids: Sequence[int],
        tokenizer: Any,
        *,
        step: int = 0,
        tools: Sequence[ToolSchema] | None = None,
    ) -> ParsedAction:
        """Decode generated ``token_ids`` and parse them.

        Decoding keeps special tokens, because some models emit ``<tool_call>`` as one special token and
        ``skip_special_tokens=True`` would erase the markers (seed 001, section 19, check 6); a trailing
        end-of-sequence token is then dropped so it does not end up in ``content``. Only the text is
        derived here: the ids themselves stay what the policy generated (token-in/token-out).
        """
        text = tokenizer.decode(list(token_ids), skip_special_tokens=False)
        for marker in (getattr(tokenizer, "eos_token", None), getattr(tokenizer, "pad_token", None)):
            if isinstance(marker, str) and marker:
                while text.endswith(marker):
                    text = text[: -len(marker)]
        return self.parse(text, step=step, tools=tools)


_ParserT = TypeVar("_ParserT", bound=type[ToolCallParser])
#: Tool-call parsers by name (``tool_parser``).
PARSERS: Registry[type[ToolCallParser]] = Registry("tool parser", "tool_parser")


def register_parser(name: str) -> Callable[[_ParserT], _ParserT]:
    """Class decorator: make a :class:`ToolCallParser` subclass selectable as ``tool_parser: <name>``.

    A second class under the same name is an error, so two plugins cannot silently replace each other.
    """

    def decorator(cls: _ParserT) -> _ParserT:
        PARSERS.add(name, cls)
        cls.name = name
        return cls

    return decorator


def parser_names() -> list[str]:
    """Registered parser names, sorted."""
    return PARSERS.names()


def get_parser(name: str, **options: Any) -> ToolCallParser:
    """Instantiate the parser registered as ``name`` with its ``options`` (e.g. ``tool_name`` for python_code)."""
    cls = PARSERS.get(name)
    try:
        return cls(**options)
    except TypeError as err:
        raise ConfigError(f"tool parser {name!r}: bad options {sorted(options)}: {err}") from err


ParserSpec = str | Mapping[str, Any] | Sequence[Any] | ToolCallParser


def build_parser(spec: ParserSpec) -> ToolCallParser:
    """Build a parser from its config value.

    * ``"hermes"`` -> that parser with default options;
    * ``{"name": "python_code", "tool_name": "exec"}`` -> that parser with options;
    * ``["hermes", "final_answer"]`` -> a ``composite`` of the parts, applied in that order;
    * an already built parser is returned as is.
    """
    if isinstance(spec, ToolCallParser):
        return spec
    if isinstance(spec, str):
        return get_parser(spec)
    if isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if not isinstance(name, str):
            raise ConfigError(f"tool_parser: a mapping needs a string 'name' key; got {dict(spec)!r}")
        return get_parser(name, **options)
    if isinstance(spec, Sequence) and not isinstance(spec, bytes | bytearray):
        if not spec:
            raise ConfigError(
                "tool_parser: an empty list names no parser; give at least one, e.g. ['hermes']"
            )
        return get_parser("composite", parsers=list(spec))
    raise ConfigError(
        f"tool_parser must be a parser name, a mapping with 'name', or a list of those; got {type(spec).__name__}"
    )
