"""Chat template -> token ids, with the policy's generated turns inserted token-exact.

Why not ``apply_chat_template(tokenize=True)``: that would re-encode the text of earlier assistant turns,
and a decoded-then-encoded generation is not always the same ids (BPE merges across the boundary, or the
model sampled a non-canonical split). Training on such ids would score tokens the policy never produced.

How, instead: every message whose ids are known (``generated_ids``) is rendered with a unique placeholder
as its content, every appended span (``join_previous``: experience, hints) is wrapped in placeholders, and
the template renders the whole conversation once as text. The text is cut at the placeholders; each text
chunk is tokenised on its own, the generated ids are spliced in where their placeholder was.

Why this is exact for ChatML-like templates: each chunk starts right after a special token (``<|im_end|>``
ends a generated turn, or the chunk itself starts with the template's ``<|im_end|>`` closing when the
generation was cut short) or at the very start, and HF tokenizers split special tokens out before any
merge, so a chunk tokenised alone gives the ids the same text gets inside the full rendering. Appended
spans are tokenised alone on purpose (their token span is then exact, so they can be stripped later);
their ids still decode to the same text. ``decode(ids) == rendering`` holds in every case; tests check it.

When a generation ended with EOS, the template's own closing of that turn starts with the EOS text; the
renderer drops it (the model's EOS token already closes the turn). A template whose assistant turn does
not close with EOS cannot be used token-in/token-out, and rendering says so.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentevolver.module.context_manager.messages import Author, ContextMessage

logger = logging.getLogger(__name__)

__all__ = ["ContextRenderer", "RenderedContext", "TemplateMismatchError"]


class TemplateMismatchError(ValueError):
    """The chat template does not render a conversation in a way token-in/token-out can follow."""


@dataclass(frozen=True)
class RenderedContext:
    """Token ids of one context, and where each appended span landed (``(item index, start, end)``)."""

    ids: list[int]
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    items: tuple[ContextMessage, ...] = ()

    def span_of(self, author: Author) -> tuple[int, int] | None:
        """Token span ``[start, end)`` of the first appended span written by ``author``, if any."""
        for index, start, end in self.spans:
            if self.items[index].author is author:
                return start, end
        return None


class ContextRenderer:
    """Renders :class:`ContextMessage` lists with one tokenizer, chat template, tool list and kwargs.

    Tokenised chunks are cached by text: a context manager re-renders the whole conversation every turn, and
    all chunks but the newest one repeat, so each turn only tokenises what is new.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(tool) for tool in tools] if tools else None
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        if self.eos_id is None or not self.eos_text:
            raise TemplateMismatchError("the tokenizer has no eos token; a turn-based template needs one")
        self._cache: dict[str, tuple[int, ...]] = {}
        self._nonce = secrets.token_hex(6)
        self._marker = re.compile("\ue000" + self._nonce + r"([GOC])(\d+)\ue001")

    # ------------------------------------------------------------------ tokens
    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` alone (no BOS/EOS added), cached; warns once per chunk if decoding is lossy."""
        cached = self._cache.get(text)
        if cached is None:
            cached = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if self.tokenizer.decode(list(cached), skip_special_tokens=False) != text:
                logger.warning("tokenizer does not round-trip a rendered chunk (%d chars); decode(prompt) "
                               "will differ from the template text", len(text))
            self._cache[text] = cached
        return list(cached)

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` alone."""
        return len(self.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens kept (for records and history text, never for training ids)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    # ------------------------------------------------------------------ text
    def render_text(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for plain message dicts (what ``apply_chat_template`` would tokenise)."""
        text = self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )
        if not isinstance(text, str):  # some tokenizer versions wrap the result
            raise TemplateMismatchError(f"apply_chat_template returned {type(text).__name__}, not text")
        return text

    def plain_text(self, items: Sequence[ContextMessage], add_generation_prompt: bool = True) -> str:
        """The template's rendering of ``items`` with every content as text (joined spans merged)."""
        return self.render_text(merge_joined(items), add_generation_prompt)

    # ------------------------------------------------------------------ ids
    def render(self, items: Sequence[ContextMessage], add_generation_prompt: bool = True) -> RenderedContext:
        """Token ids of ``items`` as the template lays them out, generated turns spliced in verbatim."""
        items = tuple(items)
        text = self.render_text(self._with_markers(items), add_generation_prompt)
        ids: list[int] = []
        spans: list[tuple[int, int, int]] = []
        open_spans: dict[int, int] = {}
        expected = {("G", i) for i, m in enumerate(items) if m.generated_ids is not None}
        expected |= {(kind, i) for i, m in enumerate(items) if m.join_previous for kind in "OC"}
        seen: set[tuple[str, int]] = set()
        closing_eos = False  # the previous piece was a generation that ended with EOS
        position = 0
        for match in self._marker.finditer(text):
            ids += self._chunk(text[position:match.start()], closing_eos)
            closing_eos = False
            kind, index = match.group(1), int(match.group(2))
            if (kind, index) in seen:
                raise TemplateMismatchError(f"the chat template rendered message {index} twice")
            seen.add((kind, index))
            if kind == "G":
                generated = list(items[index].generated_ids or ())
                ids += generated
                closing_eos = bool(generated) and generated[-1] == self.eos_id
            elif kind == "O":
                open_spans[index] = len(ids)
            else:
                spans.append((index, open_spans.pop(index), len(ids)))
            position = match.end()
        ids += self._chunk(text[position:], closing_eos)
        if seen != expected:
            missing = sorted(index for _, index in expected - seen)
            raise TemplateMismatchError(
                f"the chat template dropped the content of message(s) {missing}; token-in/token-out needs a "
                "template that renders every message's content"
            )
        turns = [i for i, m in enumerate(items) if m.author is Author.EXPERIENCE and not m.join_previous]
        if turns:
            spans.append((turns[0], *self._turns_span(items, ids, add_generation_prompt)))
        return RenderedContext(ids=ids, spans=spans, items=items)

    def _turns_span(self, items: tuple[ContextMessage, ...], ids: list[int],
                    add_generation_prompt: bool) -> tuple[int, int]:
        """``[start, end)`` of the experience given as whole turns (exemplars), headers and closings included.

        Markers cannot mark them: a turn's header and closing are the template's, outside any content.
        Rendering the items without the turns gives ``without``; the span is the run of tokens whose cut
        leaves exactly ``without``. Several runs can do that when the turns' first header repeats the
        question's (ChatML: ``<|im_start|>user``), so the one that starts where the messages before the turns
        end (their own rendering, a prefix of ``ids`` for ChatML-like templates) is taken; a template for
        which that run does not cut cleanly gets the run after the longest common prefix, which always does.
        """
        is_turn = [m.author is Author.EXPERIENCE and not m.join_previous for m in items]
        without = self.render([m for m, turn in zip(items, is_turn, strict=True) if not turn],
                              add_generation_prompt).ids
        added = len(ids) - len(without)
        first = is_turn.index(True)
        try:  # a template may refuse a conversation that ends before the turns (e.g. on a system message)
            before = self.render(items[:first], add_generation_prompt=False).ids if first else []
        except Exception:  # any template error only means: no prefix rendering to align the span with
            before = None
        if before is not None:
            start = len(before)
            if ids[:start] == before and ids[:start] + ids[start + added:] == without:
                return start, start + added
        start = 0
        while start < len(without) and ids[start] == without[start]:
            start += 1
        return start, start + added

    def _chunk(self, text: str, closing_eos: bool) -> list[int]:
        """Ids of one text chunk; after a generation that ended with EOS, the template's EOS is dropped."""
        if closing_eos:
            if not text.startswith(self.eos_text):
                raise TemplateMismatchError(
                    f"the chat template does not close an assistant turn with the eos token {self.eos_text!r}; "
                    f"it renders {text[:40]!r} after the generated text"
                )
            text = text[len(self.eos_text):]
        return self.encode(text) if text else []

    def _with_markers(self, items: Sequence[ContextMessage]) -> list[dict[str, Any]]:
        """Message dicts for the template: placeholders for generated contents and around joined spans."""
        dicts: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            if item.join_previous:
                if not dicts or items[index - 1].generated_ids is not None:
                    raise ValueError(f"message {index} joins the previous message, which must be rendered text")
                dicts[-1]["content"] += self._mark("O", index) + item.content + self._mark("C", index)
                continue
            data = item.message.model_dump(exclude_none=True)
            if item.generated_ids is not None:
                data["content"] = self._mark("G", index)
                data.pop("tool_calls", None)  # the generated text already holds the calls, as generated
            dicts.append(data)
        return dicts

    def _mark(self, kind: str, index: int) -> str:
        return f"\ue000{self._nonce}{kind}{index}\ue001"


def merge_joined(items: Sequence[ContextMessage]) -> list[dict[str, Any]]:
    """Message dicts with every ``join_previous`` text appended to the message before it."""
    dicts: list[dict[str, Any]] = []
    for item in items:
        if item.join_previous and dicts:
            dicts[-1]["content"] += item.content
        else:
            dicts.append(item.message.model_dump(exclude_none=True))
    return dicts
