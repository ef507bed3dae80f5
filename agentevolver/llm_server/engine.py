"""The served model: prompts in, finished choices out, over the batched CPU generator.

:class:`~agentevolver.backends.cpu.HFGenerator` works on token ids; this module adds what an
OpenAI-compatible server needs on top of it and nothing else: rendering chat messages with the model's chat
template, the context-length check (answered as a 400 naming the field to change), stop *strings*, n
choices per request, decoded text, per-token log-probs, tool-call parsing and grammars for
``response_format`` (:mod:`.structured`: one constraint per choice, decoded in the same batch as the rest).

Stop strings: the generator stops on token ids only and does not report tokens as it goes, so a stop
string is enforced in two layers. Every vocabulary token whose text contains the string becomes a stop
token id (the common case, e.g. ``"\\n"`` or ``"Answer:"`` generated as one token, then ends the row at
once); a string that the model spells across several tokens is found in the decoded text afterwards and
the reply is cut there (correct output, but the row ran on to EOS or ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentevolver.llm_server.errors import ServerError
from agentevolver.llm_server.structured import StructuredOutputs
from agentevolver.schema.llm_wire import ResponseFormat

__all__ = ["Choice", "Engine", "TokenLogprob"]

logger = logging.getLogger(__name__)

#: Most stop strings per request (OpenAI allows 4; vLLM no limit; each costs a vocabulary scan once).
MAX_STOP_STRINGS = 16

#: Stop strings whose token ids are remembered (oldest forgotten first).
_STOP_CACHE_ENTRIES = 256

_request_ids = itertools.count()


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token of the returned text and its log-prob (see docs/cpu_generator.md for the definition)."""

    token: str
    logprob: float


@dataclass(frozen=True, slots=True)
class Choice:
    """One finished completion of a prompt.

    ``finish_reason`` is OpenAI's: ``stop`` (EOS, a stop token or a stop string), ``length`` (``max_tokens``)
    or ``tool_calls`` (set later by the route when the text held tool calls). ``completion_tokens`` counts
    every generated token, including the closing EOS and tokens after a stop string that was found in the
    text afterwards: it is what the model computed.
    """

    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: list[TokenLogprob] | None


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """What one prompt asks of the generator, already validated by the request models."""

    max_tokens: int | None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: bool = False
    n: int = 1


class Engine:
    """Owns the generator and its tokenizer; one per server process.

    Args:
        generator: a loaded :class:`~agentevolver.backends.cpu.HFGenerator` (its ``tokenizer`` set).
        served_name: the model name clients must send.
        max_model_len: prompt + completion tokens allowed per request (at most the model's positions).
    """

    def __init__(self, generator: Any, *, served_name: str, max_model_len: int) -> None:
        tokenizer = generator.tokenizer
        if tokenizer is None:
            raise ValueError("the generator has no tokenizer; load it with HFGenerator.from_pretrained")
        limit = generator.max_positions
        if limit is not None and max_model_len > limit:
            raise ValueError(
                f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings ({limit}); "
                f"pass at most {limit} or leave it out"
            )
        if max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2; got {max_model_len}")
        self.generator = generator
        self.tokenizer = tokenizer
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(generator.eos_token_ids)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        # Text of every vocabulary token, for turning stop strings into stop token ids (0.2 s for 49k tokens).
        self._token_texts: list[str] = tokenizer.batch_decode([[i] for i in range(generator.vocab_size)])
        self._stop_ids: dict[str, tuple[int, ...]] = {}
        # Special tokens never appear in the returned text (decoded with skip_special_tokens), so a stop
        # string matches one only when it *is* that token (e.g. stop="<|im_start|>").
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._special_ids = frozenset(
            {int(i) for i, token in added.items() if getattr(token, "special", False)}
            | {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
        )
        self.structured = StructuredOutputs(
            tokenizer, vocab_size=generator.vocab_size, stop_token_ids=sorted(self.eos_token_ids),
            token_texts=self._token_texts, special_ids=self._special_ids,
        )

    @classmethod
    def load(
        cls,
        model: str,
        *,
        served_name: str | None = None,
        max_model_len: int | None = None,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.02,
        dtype: str = "float32",
        seed: int | None = None,
        chat_template: str | None = None,
        turn_cache_mb: float = 1024,
    ) -> Engine:
        """Load ``model`` (a built-in name or a local HF folder) into a new generator and wrap it.

        ``max_model_len`` defaults to the model's ``max_position_embeddings``; ``chat_template`` (jinja
        text) replaces the tokenizer's own.
        """
        from agentevolver.backends.cpu import HFGenerator

        generator = HFGenerator.from_pretrained(
            model, dtype=dtype, max_batch_size=max_batch_size, batch_wait_s=batch_wait_s, seed=seed,
            turn_cache_mb=turn_cache_mb,
        )
        if chat_template is not None:
            generator.tokenizer.chat_template = chat_template
        limit = max_model_len or generator.max_positions
        if limit is None:
            raise ValueError(
                "the model config has no max_position_embeddings: pass --max-model-len (its context length)"
            )
        return cls(generator, served_name=served_name or model, max_model_len=limit)

    async def aclose(self) -> None:
        await self.generator.aclose()

    @property
    def stats(self) -> dict[str, float]:
        return dict(self.generator.stats)

    async def grammar_for(self, response_format: ResponseFormat | None) -> Any | None:
        """The grammar ``response_format`` asks for (None for text); a 400 naming the field when refused."""
        return await self.structured.grammar_for(response_format)

    # -- prompts -------------------------------------------------------------------------------------------

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None,
    ) -> list[int]:
        """Token ids of the conversation rendered by the chat template, ending with the assistant header."""
        if not self.has_chat_template:
            raise ServerError(
                400,
                f"the served model {self.served_name!r} has no chat template, so chat messages cannot be "
                "rendered: use /v1/completions with a raw prompt, or restart the server with --chat-template FILE",
                param="messages",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
            )
        except Exception as err:  # jinja raises its own errors for conversations the template refuses
            raise ServerError(
                400, f"the chat template could not render these messages: {type(err).__name__}: {err}",
                param="messages",
            ) from None
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a raw prompt (no special tokens added: the caller wrote the prompt it wants)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def check_prompt(self, prompt_ids: Sequence[int], *, max_tokens: int | None, prompt_field: str,
                     limit_field: str) -> int:
        """Return the completion budget for this prompt, or a 400 naming what to shorten.

        Without an explicit ``max_tokens`` a reply may use the rest of the context, as vLLM allows.
        """
        length = len(prompt_ids)
        if length == 0:
            raise ServerError(400, f"{prompt_field} is empty: a completion needs at least one prompt token",
                              param=prompt_field)
        room = self.max_model_len - length
        if room < 1:
            raise ServerError(
                400,
                f"the prompt is {length} tokens, which leaves no room in this model's context "
                f"(max_model_len {self.max_model_len}): shorten {prompt_field}",
                param=prompt_field,
            )
        if max_tokens is None:
            return room
        if max_tokens > room:
            raise ServerError(
                400,
                f"{limit_field} ({max_tokens}) + the prompt ({length} tokens) = {max_tokens + length} exceeds "
                f"max_model_len {self.max_model_len}: lower {limit_field} to at most {room} or shorten "
                f"{prompt_field}",
                param=limit_field,
            )
        return max_tokens

    # -- generation ----------------------------------------------------------------------------------------

    async def complete(self, prompt_ids: list[int], sampling: SamplingRequest, *, max_tokens: int,
                       grammar: Any | None = None) -> list[Choice]:
        """Generate ``sampling.n`` choices for one prompt; they are batched with every other pending request.

        Choice ``i`` of a request with ``seed`` s samples with seed ``s + i``: the same seed for every choice
        would give n identical samples (the generator gives each seeded request its own stream). With a
        ``grammar`` (:meth:`grammar_for`) every choice follows it, each with its own grammar state.
        """
        if len(sampling.stop) > MAX_STOP_STRINGS:
            raise ServerError(400, f"stop has {len(sampling.stop)} strings; at most {MAX_STOP_STRINGS} are "
                                   "accepted", param="stop")
        stop_ids = set(sampling.stop_token_ids)
        for stop in sampling.stop:
            stop_ids.update(self._ids_containing(stop))
        params: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "repetition_penalty": sampling.repetition_penalty,
            "stop_token_ids": sorted(stop_ids),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": sampling.logprobs,
        }
        base = next(_request_ids)
        calls = []
        for index in range(sampling.n):
            seed = None if sampling.seed is None else sampling.seed + index
            constraint = self.structured.constraint(grammar) if grammar is not None else None
            calls.append(self.generator.generate(
                f"llm-server-{base}-{index}", prompt_ids=prompt_ids, sampling_params={**params, "seed": seed},
                constraint=constraint,
            ))
        try:
            outputs = await asyncio.gather(*calls)
        except ValueError as err:  # the generator's own check of a sampling value or the prompt
            raise ServerError(400, str(err).replace("sampling_params.", ""), param=_param_of(str(err))) from None
        choices = []
        for output in outputs:
            if output.stop_reason == "aborted":
                raise ServerError(503, "the server is shutting down; the request was not completed",
                                  type_="server_error")
            choices.append(self._choice(output, sampling))
        return choices

    def _choice(self, output: Any, sampling: SamplingRequest) -> Choice:
        ids = list(output.token_ids)
        logprobs = list(output.log_probs or [])
        closing = self.eos_token_ids | self._special_ids | set(sampling.stop_token_ids)
        # the closing EOS / stop token is not part of the reply's text (as in vLLM)
        kept = ids[:-1] if output.stop_reason == "completed" and ids and ids[-1] in closing else ids
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        finish = "stop" if output.stop_reason == "completed" else "length"
        cut = _first_stop(text, sampling.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            kept = kept[: self._tokens_within(kept, cut)]
        token_logprobs = None
        if sampling.logprobs:
            token_logprobs = [
                TokenLogprob(self._token_texts[token], float(lp)) for token, lp in zip(kept, logprobs, strict=False)
            ]
        return Choice(text=text, finish_reason=finish, completion_tokens=len(ids), logprobs=token_logprobs)

    def _tokens_within(self, ids: list[int], chars: int) -> int:
        """How many leading tokens of ``ids`` decode to at most ``chars`` characters (binary search)."""
        low, high = 0, len(ids)
        while low < high:
            mid = (low + high + 1) // 2
            if len(self.tokenizer.decode(ids[:mid], skip_special_tokens=True)) <= chars:
                low = mid
            else:
                high = mid - 1
        return low

    def _ids_containing(self, stop: str) -> tuple[int, ...]:
        """Vocabulary ids whose text contains ``stop`` (cached: roles send the same stop strings every call)."""
        ids = self._stop_ids.get(stop)
        if ids is None:
            ids = tuple(
                i for i, text in enumerate(self._token_texts)
                if (text == stop if i in self._special_ids else stop in text)
            )
            if len(self._stop_ids) >= _STOP_CACHE_ENTRIES:
                self._stop_ids.pop(next(iter(self._stop_ids)))
            self._stop_ids[stop] = ids
        return ids


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    positions = [pos for pos in (text.find(stop) for stop in stops) if pos >= 0]
    return min(positions) if positions else None


def _param_of(message: str) -> str | None:
    """The request field a generator ``ValueError`` names (``sampling_params.<key> ...``), if any."""
    if message.startswith("sampling_params."):
        return message.removeprefix("sampling_params.").split(" ", 1)[0]
    if message.startswith("prompt_ids"):
        return "prompt"
    return None
