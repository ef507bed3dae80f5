"""Sampling settings: validated once per request, then applied per row of a batched decode step.

verl's agent-loop manager sends vLLM-style ``sampling_params`` dicts. A typo'd value (``top_p=0``,
``temperature=-1``) would make vLLM fail far from its cause, and here it would silently sample garbage, so
every known key is checked up front and a bad one raises ``ValueError`` naming the key and its allowed
range. Unknown keys are ignored: verl adds keys over time (``ignore_eos``, ``priority``...) that mean nothing
to this backend.

:class:`RowSampler` then applies each row's own settings inside one batched step, so requests with different
temperatures or top-p values can share a forward pass instead of being split into separate batches.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

#: Keys this backend reads; everything else in ``sampling_params`` is ignored.
KNOWN_KEYS = frozenset(
    {"temperature", "top_p", "top_k", "repetition_penalty", "logprobs", "max_tokens", "max_new_tokens",
     "stop_token_ids", "ignore_eos", "seed"}
)


#: Temperatures below this are greedy, as in vLLM (its ``_SAMPLING_EPS``): dividing logits by a temperature of,
#: say, 1e-300 overflows to inf and the softmax to NaN (a 500 the LLM server's schema fuzz found).
SAMPLING_EPS = 1e-5

#: Repetition penalties and temperatures are clamped into ``[1 / SCALE_BOUND, SCALE_BOUND]`` when a batch is
#: built. Scores are float32: a penalty of 1e40 becomes ``inf`` there, a logit of 0 times it is NaN and the
#: multinomial fails (the schema fuzz's request ``repetition_penalty=1e300`` did exactly this). Within the
#: bound a logit of magnitude 1e4 divided by the penalty and by the smallest sampled temperature stays below
#: 1e29, far inside float32's 3.4e38, and a penalty or temperature beyond it already acts as its limit
#: (seen tokens always or never chosen; a uniform draw), so the clamp changes no outcome.
SCALE_BOUND = 1e20


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """One request's validated sampling settings (defaults are vLLM's)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (verl's -1 is normalised to 0)
    repetition_penalty: float = 1.0
    logprobs: bool = False
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # vLLM's flag: only stop_token_ids (and max_tokens) end the response
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS


def parse_sampling_params(
    params: Mapping[str, Any], *, default_max_tokens: int | None, vocab_size: int
) -> SamplingSettings:
    """Validate the keys this backend knows and return them as :class:`SamplingSettings`.

    ``max_tokens`` (or sglang's ``max_new_tokens``, which verl's vLLM server also accepts) falls back to
    ``default_max_tokens``; with neither, the request is rejected rather than running to the context limit.

    Raises:
        ValueError: a known key has a bad type or value; the message names ``sampling_params.<key>``.
    """
    if not isinstance(params, Mapping):
        raise ValueError(f"sampling_params must be a dict; got {type(params).__name__}")
    temperature = _real(params, "temperature", 1.0)
    if temperature < 0:
        raise ValueError(f"sampling_params.temperature must be >= 0 (0 = greedy); got {temperature:g}")
    top_p = _real(params, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ValueError(f"sampling_params.top_p must be in (0, 1]; got {top_p:g}")
    top_k = _integer(params, "top_k", 0)
    if top_k < -1:
        raise ValueError(f"sampling_params.top_k must be -1 or 0 (off) or >= 1; got {top_k}")
    repetition_penalty = _real(params, "repetition_penalty", 1.0)
    if repetition_penalty <= 0:
        raise ValueError(f"sampling_params.repetition_penalty must be > 0 (1 = off); got {repetition_penalty:g}")
    return SamplingSettings(
        max_tokens=_max_tokens(params, default_max_tokens),
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        repetition_penalty=repetition_penalty,
        logprobs=_flag(params, "logprobs"),
        stop_token_ids=_stop_token_ids(params, vocab_size),
        ignore_eos=_flag(params, "ignore_eos"),
        seed=_optional_integer(params, "seed"),
    )


def _max_tokens(params: Mapping[str, Any], default: int | None) -> int:
    key = "max_tokens" if params.get("max_tokens") is not None else "max_new_tokens"
    value = params.get(key)
    if value is None:
        if default is None:
            raise ValueError(
                "sampling_params.max_tokens is required (this generator has no default_max_tokens); "
                "pass an integer >= 1"
            )
        return default
    max_tokens = _optional_integer(params, key)
    if max_tokens is None or max_tokens < 1:
        raise ValueError(f"sampling_params.{key} must be >= 1; got {max_tokens}")
    return max_tokens


def _real(params: Mapping[str, Any], key: str, default: float) -> float:
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"sampling_params.{key} must be a number; got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"sampling_params.{key} must be finite; got {value!r}")
    return float(value)


def _integer(params: Mapping[str, Any], key: str, default: int) -> int:
    value = _optional_integer(params, key)
    return default if value is None else value


def _optional_integer(params: Mapping[str, Any], key: str) -> int | None:
    """An int (numpy ints too), also accepting integral floats (configs sometimes produce ``16.0``)."""
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"sampling_params.{key} must be an integer; got {value!r}")
    return int(value)


def _flag(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key)
    if value is None:
        return False
    if not isinstance(value, bool | numbers.Integral):
        raise ValueError(f"sampling_params.{key} must be a bool; got {value!r}")
    return bool(value)


def _stop_token_ids(params: Mapping[str, Any], vocab_size: int) -> tuple[int, ...]:
    value = params.get("stop_token_ids")
    if value is None:
        return ()
    if isinstance(value, torch.Tensor) or hasattr(value, "__array__"):
        value = value.tolist()  # numpy arrays / tensors of ids
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"sampling_params.stop_token_ids must be a list of token ids; got {value!r}")
    for token in value:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= token < vocab_size:
            raise ValueError(
                f"sampling_params.stop_token_ids must hold integers in [0, {vocab_size}); got {token!r}"
            )
    return tuple(int(token) for token in value)


class TokenConstraint(Protocol):
    """Restricts which tokens one row may choose next, e.g. to a JSON schema's grammar.

    Implemented by the local LLM server (:mod:`agentevolver.llm_server.structured`); the generator only
    calls it. One object serves one row of one request and is used from the decode thread only.
    """

    def mask(self, scores: torch.Tensor) -> None:
        """Set the scores of the tokens this row may not choose next to ``-inf``, in place (1-D, vocabulary)."""

    def accept(self, token: int) -> None:
        """Advance past ``token``, the row's chosen next token."""


def _bounded(scale: float) -> float:
    """``scale`` clamped into ``[1 / SCALE_BOUND, SCALE_BOUND]`` (see :data:`SCALE_BOUND`)."""
    return min(max(scale, 1 / SCALE_BOUND), SCALE_BOUND)


class RowSampler:
    """Chooses the next token of every row of a batch, each row under its own :class:`SamplingSettings`.

    Per row: repetition penalty (vLLM/HF rule: positive logits divided, negative multiplied, over tokens
    of the prompt and the output so far), then argmax for greedy rows, or temperature -> top-k -> top-p ->
    multinomial for sampled rows. The returned log-prob is ``log_softmax(raw_logits / T)`` at the chosen
    token (``T = 1`` for greedy rows): exactly what verl's actor recomputes, which never sees the
    penalty, top-k or top-p. Rows are removed with :meth:`select` as they finish and added with :meth:`extend` as requests join.

    A row with a :class:`TokenConstraint` has its scores masked first (on a copy: the log-prob stays the
    model's own, as vLLM reports it by default) and tells the constraint which token it chose. Without any
    constraint in the batch this costs nothing: no copy, no loop.
    """

    def __init__(
        self,
        settings: Sequence[SamplingSettings],
        prompts: Sequence[Sequence[int]],
        *,
        vocab_size: int,
        shared_rng: torch.Generator,
        device: torch.device,
        constraints: Sequence[TokenConstraint | None] | None = None,
    ) -> None:
        self._device = device
        self._constraints = list(constraints) if constraints and any(c is not None for c in constraints) else None
        self._temperature = torch.tensor(
            [_bounded(s.temperature) if not s.greedy else 1.0 for s in settings], device=device
        )
        self._greedy = torch.tensor([s.greedy for s in settings], device=device)
        # top-k 0 (off) becomes the whole vocabulary so one gather serves every row.
        self._top_k = torch.tensor([s.top_k or vocab_size for s in settings], device=device)
        self._top_p = torch.tensor([s.top_p for s in settings], device=device)
        self._penalty = torch.tensor([_bounded(s.repetition_penalty) for s in settings], device=device)
        # A request with its own seed gets its own generator, so its samples do not depend on which other
        # requests share the batch; the rest draw, in row order, from the generator-wide stream.
        self._rngs = [
            torch.Generator(device=device).manual_seed(s.seed) if s.seed is not None else shared_rng
            for s in settings
        ]
        self._any_sampled = not bool(self._greedy.all())
        self._any_logprobs = any(s.logprobs for s in settings)
        self._any_filter = bool((self._top_k < vocab_size).any() or (self._top_p < 1).any())
        self._seen: torch.Tensor | None = None
        if bool((self._penalty != 1).any()):
            self._seen = torch.zeros((len(settings), vocab_size), dtype=torch.bool, device=device)
            for row, prompt in enumerate(prompts):
                self._seen[row, torch.tensor(prompt, dtype=torch.long, device=device)] = True

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices into the current batch), in that order."""
        self._temperature = self._temperature[rows]
        self._greedy = self._greedy[rows]
        self._top_k = self._top_k[rows]
        self._top_p = self._top_p[rows]
        self._penalty = self._penalty[rows]
        kept = rows.tolist()
        self._rngs = [self._rngs[i] for i in kept]
        if self._constraints is not None:
            self._constraints = [self._constraints[i] for i in kept]
        if self._seen is not None:
            self._seen = self._seen[rows]

    def extend(self, other: RowSampler) -> None:
        """Append ``other``'s rows after this sampler's (rows joining a running batch, in cache order).

        Each row keeps its own settings, generator, constraint and seen-token set; a side without
        constraints or penalties gets neutral entries (no constraint; an empty seen set under penalty 1,
        which leaves its scores unchanged).
        """
        rows, other_rows = self._temperature.shape[0], other._temperature.shape[0]
        self._temperature = torch.cat([self._temperature, other._temperature])
        self._greedy = torch.cat([self._greedy, other._greedy])
        self._top_k = torch.cat([self._top_k, other._top_k])
        self._top_p = torch.cat([self._top_p, other._top_p])
        self._penalty = torch.cat([self._penalty, other._penalty])
        self._rngs = [*self._rngs, *other._rngs]
        if self._constraints is not None or other._constraints is not None:
            self._constraints = [*(self._constraints or [None] * rows), *(other._constraints or [None] * other_rows)]
        if self._seen is not None or other._seen is not None:
            vocab = (self._seen if self._seen is not None else other._seen).shape[1]  # type: ignore[union-attr]
            mine = self._seen if self._seen is not None else \
                torch.zeros((rows, vocab), dtype=torch.bool, device=self._device)
            theirs = other._seen if other._seen is not None else \
                torch.zeros((other_rows, vocab), dtype=torch.bool, device=self._device)
            self._seen = torch.cat([mine, theirs])
        self._any_sampled = self._any_sampled or other._any_sampled
        self._any_logprobs = self._any_logprobs or other._any_logprobs
        self._any_filter = self._any_filter or other._any_filter

    @property
    def takes_drafts(self) -> bool:
        """Whether :meth:`verify` can check drafted tokens for this batch: not under a repetition penalty or a
        token constraint, whose state advances token by token."""
        return self._seen is None and self._constraints is None

    def verify(self, block_logits: torch.Tensor, drafts: Sequence[Sequence[int]]) -> list[tuple[int, list[float]]]:
        """Speculative decoding's test of drafted tokens: per row, how many of its draft it accepts, and their
        log-probs. ``block_logits[row, i]`` are the next-token logits after the row's ``i``-th fed token of the
        block (its sampled token, then its draft); ``drafts[row]`` its drafted tokens (at most ``width - 1``).

        A greedy row accepts a drafted token while it is the argmax. A sampled row accepts drafted token ``d``
        with probability ``p(d)`` under its own distribution (temperature, top-k, top-p), drawing from its own
        generator: the draft is a single token (prompt lookup proposes, it does not sample), so this is the
        standard speculative-sampling test, and after a rejection the next token is drawn from ``p`` without
        ``d`` (:meth:`__call__`'s ``exclude``), so every emitted token has exactly the distribution plain
        decoding would give it. Log-probs are ``log_softmax(raw / T)`` at the token, as :meth:`__call__`'s.
        """
        rows, width = block_logits.shape[0], block_logits.shape[1] - 1
        longest = max((len(draft) for draft in drafts), default=0)
        if longest == 0:
            return [(0, []) for _ in range(rows)]
        raw = block_logits[:, :longest].float()
        drafted = torch.zeros((rows, longest), dtype=torch.long, device=self._device)
        for row, draft in enumerate(drafts):
            if len(draft) > width:
                raise ValueError(f"row {row}: a draft of {len(draft)} tokens for a block of {width}")
            drafted[row, :len(draft)] = torch.tensor(list(draft), dtype=torch.long, device=self._device)
        scaled = raw / self._temperature[:, None, None]
        logprobs = scaled.gather(2, drafted[..., None]).squeeze(2) - torch.logsumexp(scaled, dim=-1)
        accept = raw.argmax(dim=-1) == drafted
        if self._any_sampled:
            vocab = scaled.shape[-1]
            flat = scaled.reshape(rows * longest, vocab)
            if self._any_filter:
                flat = self._filter(flat, self._top_k.repeat_interleave(longest), self._top_p.repeat_interleave(longest))
            chance = torch.softmax(flat, dim=-1).reshape(rows, longest, vocab).gather(2, drafted[..., None]).squeeze(2)
            draws = torch.stack([torch.rand(longest, generator=rng, device=self._device) for rng in self._rngs])
            accept = torch.where(self._greedy[:, None], accept, draws < chance)
        results: list[tuple[int, list[float]]] = []
        for draft, flags, row_logprobs in zip(drafts, accept.tolist(), logprobs.tolist(), strict=True):
            count = 0
            while count < len(draft) and flags[count]:
                count += 1
            results.append((count, row_logprobs[:count]))
        return results

    def __call__(self, logits: torch.Tensor,
                 exclude: Sequence[int | None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return (next token per row, its log-prob) for ``logits`` of shape [rows, vocab].

        The log-probs are ``None`` when no row asked for them (they cost a pass over the vocabulary).
        ``exclude[row]``: a token a sampled row must not draw (a draft :meth:`verify` rejected), removed after
        top-k/top-p so the rest keep their relative chances; a greedy row ignores it (its argmax is not it).
        """
        raw = logits.float()
        scores = raw
        if self._constraints is not None:
            scores = raw.clone()
            for row, constraint in enumerate(self._constraints):
                if constraint is not None:
                    constraint.mask(scores[row])
        if self._seen is not None:
            penalty = self._penalty[:, None]
            penalized = torch.where(scores > 0, scores / penalty, scores * penalty)
            scores = torch.where(self._seen, penalized, scores)
        tokens = scores.argmax(dim=-1)
        if self._any_sampled:
            sampled = self._sample(scores / self._temperature[:, None], exclude)
            tokens = torch.where(self._greedy, tokens, sampled)
        if self._seen is not None:
            self._seen[torch.arange(tokens.shape[0], device=self._device), tokens] = True
        if self._constraints is not None:
            chosen_ids = tokens.tolist()
            for row, constraint in enumerate(self._constraints):
                if constraint is not None:
                    constraint.accept(chosen_ids[row])
        if not self._any_logprobs:
            return tokens, None
        scaled = raw / self._temperature[:, None]
        chosen = scaled.gather(1, tokens[:, None]).squeeze(1)
        # one row at a time: over a batch, torch splits a lone row's reduction across threads but not a
        # batch's rows, so a batched logsumexp gives a row other last bits in other company
        return tokens, chosen - torch.stack([torch.logsumexp(row, dim=-1) for row in scaled])

    def _sample(self, scaled: torch.Tensor, exclude: Sequence[int | None] | None = None) -> torch.Tensor:
        if self._any_filter:
            scaled = self._filter(scaled)
        if exclude is not None and any(token is not None for token in exclude):
            scaled = scaled.clone()
            for row, token in enumerate(exclude):
                if token is not None:
                    scaled[row, token] = -math.inf
        probs = torch.softmax(scaled, dim=-1)
        return torch.cat([
            torch.multinomial(probs[row], 1, generator=rng) for row, rng in enumerate(self._rngs)
        ])

    def _filter(self, scaled: torch.Tensor, top_k: torch.Tensor | None = None,
                top_p: torch.Tensor | None = None) -> torch.Tensor:
        """top-k then top-p, in one sort: keep the smallest prefix whose mass reaches top_p (at least 1).
        ``top_k``/``top_p``: per row of ``scaled`` (default: the batch's rows)."""
        top_k = self._top_k if top_k is None else top_k
        top_p = self._top_p if top_p is None else top_p
        ordered, order = scaled.sort(dim=-1, descending=True)
        ranks = torch.arange(scaled.shape[-1], device=self._device)
        remove = ranks[None, :] >= top_k[:, None]
        ordered = ordered.masked_fill(remove, -math.inf)
        probs = torch.softmax(ordered, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        remove |= mass_before > top_p[:, None]
        remove[:, 0] = False
        return scaled.masked_fill(remove.scatter(1, order, remove), -math.inf)
