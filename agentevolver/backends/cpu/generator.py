"""A batched Hugging Face generator with verl's rollout-server call signature, for CPU rollouts.

On GPU, agent loops call verl's server manager (``LLMServerClient.generate``), which forwards to vLLM. On a
CPU-only machine there is no vLLM, yet the same agent loop must run: :class:`HFGenerator` offers the same
``generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput`` over a transformers model.

Many episodes await ``generate`` at once, so calls are not run one by one: a background task collects the
requests that arrive within ``batch_wait_s`` of the first (up to ``max_batch_size``), left-pads them into one
batch and decodes it in a worker thread, keeping the event loop free for the episodes' environment calls.
With ``continuous_batching``, requests that arrive while a batch decodes join it at the next step boundary (up
to ``max_batch_size`` rows), and a row is answered the moment it ends, so an episode's next turn joins the
batch its last turn left instead of waiting for the longest row (:mod:`.running_batch` holds the merge).
The decode loop is our own KV-cache loop rather than ``model.generate`` because it lets every row keep its
own sampling settings, stop tokens, seed and ``max_tokens`` inside one forward pass (``model.generate``
would need one batch per distinct setting), drops rows from the batch as soon as they finish instead of
computing padding until the longest one ends, and computes only the last position's logits at prefill.
With ``batch_invariant_greedy``, greedy requests (validation) are prefilled in fixed chunks, in lockstep, with
reusable chunk keys/values (:mod:`.chunk_cache`) and then decode in company on kernels a start-up probe shows
to give each row its own bits, so a greedy answer never depends on which requests arrived with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import numbers
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentevolver.backends.cpu import decode_attention, row_blocks
from agentevolver.backends.cpu.chunk_cache import ChunkCache
from agentevolver.backends.cpu.prefix_cache import PrefixCache
from agentevolver.backends.cpu.prompt_lookup import PromptLookup
from agentevolver.backends.cpu.running_batch import Row, RunningBatch, merge_all
from agentevolver.backends.cpu.sampling import (
    RowSampler,
    SamplingSettings,
    TokenConstraint,
    parse_sampling_params,
)
from agentevolver.backends.cpu.turn_cache import TurnCache, TurnEntry

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class TokenOutput:
    """What ``generate`` returns: the fields of verl's ``TokenOutput`` this generator fills, by the same names.

    Our own class, not verl's: this package needs torch and transformers only (the GPU kernel check,
    ``tools/gpu_kernel_check.py``, runs the decoder on a machine without verl). Callers read these three
    attributes; verl's rollout ``hf`` (:mod:`agentevolver.verl.cpu.rollout`) builds verl's class from them.
    """

    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None


_DTYPES = ("float32", "bfloat16", "float16")
#: generate() keyword arguments verl may pass; a non-empty value means input this text-only backend lacks.
_MULTIMODAL_KWARGS = ("image_data", "video_data", "audio_data", "mm_processor_kwargs")


class GeneratorClosedError(RuntimeError):
    """``generate`` was called after :meth:`HFGenerator.aclose`."""


class GenerationError(RuntimeError):
    """A batch failed inside the model; every request of that batch receives one (``__cause__`` = why)."""


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt_ids: list[int]
    settings: SamplingSettings
    future: asyncio.Future[TokenOutput]
    arrived: float
    constraint: TokenConstraint | None = None


@dataclass(slots=True)
class _Output:
    stop_ids: frozenset[int]
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    stop_reason: str | None = None


class _NeverDone:
    """A stand-in for a request's future that no caller waits on (the row-independence probe's rows)."""

    @staticmethod
    def done() -> bool:
        return False


@dataclass(slots=True)
class _ChunkedRow:
    """A greedy request being prefilled in chunks (:meth:`HFGenerator._prefill_chunked`)."""

    request: _Request
    cache: Any  # its own transformers.DynamicCache: exactly ``start`` tokens once ``waiting`` is flushed
    start: int = 0  # tokens covered so far (a multiple of the chunk size until the last chunk)
    waiting: list[Any] = field(default_factory=list)  # reused chunks not yet appended (appended together)
    logits: torch.Tensor | None = None  # next-token logits, once the last chunk is computed

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_ids

    def flush(self) -> None:
        """Append the reused chunks to the cache, all in one copy."""
        if self.waiting:
            for index, parts in enumerate(zip(*self.waiting, strict=True)):
                self.cache.update(torch.cat([keys for keys, _ in parts], dim=1)[None],
                                  torch.cat([values for _, values in parts], dim=1)[None], index)
            self.waiting = []


class HFGenerator:
    """Serves ``generate`` calls from a causal LM by dynamic batching; see the module docstring.

    Args:
        model: a transformers causal LM (put in eval mode here). Used from one worker thread at a time.
        eos_token_ids: tokens that end a response (the chat template closes a turn with one of them).
        pad_token_id: id written into left padding (masked out, so any valid id works).
        max_batch_size: most requests decoded together.
        batch_wait_s: how long the first request of a batch waits for company.
        seed: seeds the generator-wide sampling stream (requests without their own ``seed``).
        default_max_tokens: used when a request's ``sampling_params`` has no ``max_tokens``.
        prefix_cache_entries: shared prompt prefixes kept prefilled (:mod:`.prefix_cache`); 0 turns it off.
        turn_cache_mb: MiB of finished rows' keys/values kept so that a conversation's next turn prefills only
            its new tokens (:mod:`.turn_cache`); 0 turns it off.
        continuous_batching: requests that arrive while a batch decodes join it at the next decode step, and
            each row is answered as soon as it ends. Off by default; on in the quickstart preset, where with
            drafts the sampled training episodes made 1.2x the tokens/s of closed batches and greedy validation
            was 0.85x (a join is its own prefill pass; docs/benchmarks.md, issue 44). Off, a batch stays closed
            until its last row ends (the composition of every batch then depends only on arrival within
            ``batch_wait_s``).
        join_free_rows: with continuous batching, queued requests join a running batch only once at least this
            many of its ``max_batch_size`` rows are free (1: at every step with a free row). Each join is a
            prefill pass over all the weights whatever the joiners' number, so admitting them a few at a time
            spends it on more rows (4 measured 1.08x over 1 on greedy validation, one round; docs/benchmarks.md).
        batch_invariant_greedy: a greedy request's (temperature 0: verl's validation) tokens depend only on the
            weights and its prompt, never on which requests happened to arrive with it. Batched as usual, a
            bf16 row's numbers move with the batch's shape (padding, shared prefix, turn cache; enough to flip
            an argmax), so the same weights could pass a task in one validation and fail it in the next when
            only the timing changed (issue 43). With this, every greedy request is prefilled alone, in chunks
            at fixed positions whose keys/values any later prompt starting with the same tokens reuses (the
            same bits either way, :mod:`.chunk_cache`), and then decodes in company: a decode step computes
            each row the same bits at any batch size and any left padding when this machine's kernels allow
            it, which a probe checks at start-up on the model itself (:meth:`probe_row_independence`,
            ``rows_independent``; products run on 2 rows up to a probed block, :mod:`.row_blocks`, and attention's
            ``probs @ v`` over a window that depends on the row alone, :func:`.decode_attention.exact_rows`). Where the
            probe fails (fp32 products pick other kernels by row count), each greedy request decodes in a batch
            of its own instead: the same guarantee, slower.
        chunk_cache_mb: MiB of greedy prompts' chunk keys/values kept for reuse (``batch_invariant_greedy``;
            :mod:`.chunk_cache`); 0 turns it off (every greedy prompt is prefilled whole, chunk by chunk).
        draft_tokens: speculative decoding with prompt-lookup drafts (:mod:`.prompt_lookup`): each decode step
            feeds every row's sampled token plus up to this many tokens that followed the last earlier
            occurrence of its tail, and keeps the drafted tokens the row's own distribution accepts
            (:meth:`.RowSampler.verify`: the argmax for greedy rows, the speculative-sampling test for sampled
            ones, so what is generated has the distribution plain decoding gives it). A decode step here reads
            every weight once whatever its rows, so checking several tokens costs little more than one. 0 (the
            default) turns it off; it is skipped for batches with a repetition penalty, a token constraint or a
            timing-proof greedy row (``batch_invariant_greedy``), which decode token by token as before. The
            numbers of a drafted token's logits come from a multi-token pass, not a one-token step, so a bf16
            near-tie can fall the other way than in plain decoding.
    """

    def __init__(
        self,
        model: Any,
        eos_token_ids: Sequence[int],
        *,
        pad_token_id: int,
        max_batch_size: int = 16,
        batch_wait_s: float = 0.002,
        seed: int | None = None,
        default_max_tokens: int | None = None,
        prefix_cache_entries: int = 4,
        turn_cache_mb: float = 1024,
        continuous_batching: bool = False,
        join_free_rows: int = 1,
        batch_invariant_greedy: bool = False,
        chunk_cache_mb: float = 512,
        draft_tokens: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1; got {max_batch_size}")
        if chunk_cache_mb < 0:
            raise ValueError(f"chunk_cache_mb must be >= 0 (0 turns the chunk cache off); got {chunk_cache_mb}")
        if turn_cache_mb < 0:
            raise ValueError(f"turn_cache_mb must be >= 0 (0 turns the turn cache off); got {turn_cache_mb}")
        if not 1 <= join_free_rows <= max_batch_size:
            raise ValueError(f"join_free_rows must be between 1 and max_batch_size ({max_batch_size}); got "
                             f"{join_free_rows}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0 (0 turns speculative decoding off); got {draft_tokens}")
        if batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0; got {batch_wait_s}")
        if default_max_tokens is not None and default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1 or None; got {default_max_tokens}")
        self.model = model.eval()
        self.device: torch.device = next(model.parameters()).device
        # bf16/fp16 decode steps: torch's CPU SDPA kernel is ~14x slower than two matmuls for one query token
        # (agentevolver/backends/cpu/decode_attention.py); fp32 keeps SDPA, which is as fast there and exact
        self.decode_attention = (
            self.device.type == "cpu" and next(model.parameters()).dtype in (torch.bfloat16, torch.float16)
            and decode_attention.install(model)
        )
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        if not self.eos_token_ids:
            raise ValueError("eos_token_ids is empty: without one, every response would run to max_tokens")
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.default_max_tokens = default_max_tokens
        self.continuous_batching = bool(continuous_batching)
        self.join_free_rows = int(join_free_rows)
        self.batch_invariant_greedy = bool(batch_invariant_greedy)
        self.draft_tokens = int(draft_tokens)
        self.tokenizer: Any = None  # set by from_pretrained, for callers that want the matching tokenizer
        self._rng = torch.Generator(device=self.device)
        if seed is None:
            self._rng.seed()  # non-deterministic, without touching torch's global RNG
        else:
            self._rng.manual_seed(seed)
        self._model_lock = threading.Lock()  # decode vs load_weights
        self._stop_batch: threading.Event | None = None  # the running batch's; aclose sets it to end it early
        self._pending: deque[_Request] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.prefix_cache = PrefixCache(max_entries=prefix_cache_entries)
        self.turn_cache = TurnCache(max_bytes=int(turn_cache_mb * 2**20))
        self.chunk_cache = ChunkCache(max_bytes=int(chunk_cache_mb * 2**20))
        #: with batch_invariant_greedy: whether a decode step's rows are independent of their company here
        #: (greedy requests then decode batched), else None; see probe_row_independence
        self.rows_independent: bool | None = None
        #: with batch_invariant_greedy: the most rows one matrix product takes (:func:`.row_blocks.probe_block_rows`;
        #: None where no block keeps rows alike, and then only one-row products are changed), else None
        self.row_block: int | None = None
        self.stats: dict[str, float] = {
            "requests": 0,  # generate calls accepted
            "streams": 0,  # times the worker thread started decoding (it runs while rows are live)
            "batches": 0,  # prefill passes (a batch starting, or requests joining a running one)
            "rows": 0,  # requests decoded (rows / batches = mean prefill size)
            "joined_running": 0,  # requests that joined a batch already decoding (continuous batching)
            "joins_in_place": 0,  # joins written into the running cache's free row slots (its rows not copied)
            "joins_copied": 0,  # joins that rebuilt the cache (a joiner wider than the batch, or no free slot)
            "max_rows": 0,  # most rows decoding together so far
            "prompt_tokens": 0,
            "prefix_cached_tokens": 0,  # prompt tokens served from the shared-prefix cache (not prefilled)
            "turn_cached_tokens": 0,  # prompt tokens served from the turn cache (an earlier turn's row)
            "chunk_passes": 0,  # forward passes of greedy prompts' chunked prefill (batch_invariant_greedy)
            "generated_tokens": 0,
            "draft_passes": 0,  # decode steps that checked drafted tokens (draft_tokens)
            "drafted_tokens": 0,  # tokens drafted in them
            "accepted_tokens": 0,  # drafted tokens kept (accepted / drafted = the drafts' hit rate)
            "decode_steps": 0,  # forward passes after prefill
            "failed_batches": 0,
            "aborted": 0,  # requests answered with stop_reason "aborted"
            "weight_loads": 0,
            "model_seconds": 0.0,  # worker-thread time in prefills and decode steps (added as each step ends)
        }
        if self.batch_invariant_greedy:
            # products of a row count this CPU computes each row alike at: 2 up to the probed block (.row_blocks)
            self.row_block = row_blocks.probe_block_rows(model)
            row_blocks.install(model, self.row_block or row_blocks.CANDIDATES[0])
            if self.decode_attention:
                decode_attention.exact_rows(model)  # a row's attention ignores its company's padding
            self.rows_independent = self.probe_row_independence()
            if self.rows_independent:
                logger.info("HFGenerator: decode steps compute each row alike in any company here (matrix "
                            "products in blocks of up to %s rows): greedy requests prefill alone and decode batched "
                            "(batch_invariant_greedy)", self.row_block)
            else:
                logger.warning("HFGenerator: decode steps here change a row's numbers with its company (%s): "
                               "each greedy request decodes in a batch of its own (batch_invariant_greedy; "
                               "slower)", next(model.parameters()).dtype)

    @classmethod
    def from_pretrained(cls, path: str, *, dtype: str = "float32", **kwargs: Any) -> HFGenerator:
        """Load a model folder or built-in name (``tiny-test``, ``smollm2-135m-instruct``) with SDPA attention.

        EOS ids come from the generation config, the model config and the tokenizer together: SmolLM2's
        chat template closes every turn with the tokenizer's eos ``<|im_end|>``, which is what must stop a
        response. ``pad_token_id`` defaults to the tokenizer's pad token (else the first EOS). ``dtype="auto"``
        is bfloat16 where bf16 is faster on this CPU, else float32 (:mod:`agentevolver.backends.cpu.precision`).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentevolver.backends.cpu.precision import AUTO, resolve_dtype
        from agentevolver.models import resolve_model_path

        if dtype == AUTO:
            dtype = "bfloat16" if resolve_dtype(AUTO) == "bf16" else "float32"
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be auto or one of {', '.join(_DTYPES)}; got {dtype!r}")
        folder = resolve_model_path(path)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype), attn_implementation="sdpa"
        )
        tokenizer = AutoTokenizer.from_pretrained(folder)
        eos = _eos_token_ids(getattr(model, "generation_config", None), model.config, tokenizer)
        pad = kwargs.pop("pad_token_id", None)
        if pad is None:
            pad = next((t for t in (tokenizer.pad_token_id, model.config.pad_token_id) if t is not None), eos[0])
        generator = cls(model, eos, pad_token_id=pad, **kwargs)
        generator.tokenizer = tokenizer
        logger.info("HFGenerator: %s (%s), eos=%s pad=%s", folder, dtype, eos, pad)
        return generator

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
        constraint: TokenConstraint | None = None, **kwargs: Any,
    ) -> TokenOutput:
        """Generate a response to ``prompt_ids``; same call as verl's ``LLMServerClient.generate``.

        Returns the response tokens cut right after the first stop token (EOS or ``stop_token_ids``,
        included, as vLLM does) or at ``max_tokens``; ``log_probs`` only when ``sampling_params["logprobs"]``.
        ``constraint`` (a :class:`~agentevolver.backends.cpu.sampling.TokenConstraint`, e.g. a JSON schema's
        grammar from the local LLM server) restricts every token of this response; the row still shares
        the batch with unconstrained ones.

        Raises:
            ValueError: a bad sampling parameter, an empty/out-of-vocabulary prompt, or a prompt that leaves
                no room for ``max_tokens`` within the model's positions.
            GenerationError: the batch this request ran in failed.
            GeneratorClosedError: after :meth:`aclose`.
        """
        if self._closed:
            raise GeneratorClosedError("HFGenerator is closed")
        for key in _MULTIMODAL_KWARGS:
            value = kwargs.get(key)
            if value is not None and (not hasattr(value, "__len__") or len(value) > 0):
                raise ValueError(f"{key} is not supported: HFGenerator serves text-only models")
        settings = parse_sampling_params(
            sampling_params, default_max_tokens=self.default_max_tokens, vocab_size=self.vocab_size
        )
        prompt = self._checked_prompt(prompt_ids, settings.max_tokens)
        loop = asyncio.get_running_loop()
        wakeup = self._ensure_serving(loop)
        future: asyncio.Future[TokenOutput] = loop.create_future()
        self._pending.append(_Request(str(request_id), prompt, settings, future, loop.time(), constraint))
        self.stats["requests"] += 1
        wakeup.set()
        return await future

    def probe_row_independence(self, *, steps: int = 3) -> bool:
        """Whether a greedy row decodes to the same bits alone and amid other rows, with this model here.

        Why a probe and not a rule: it is a property of the kernels torch picks on this CPU for this dtype.
        On a 2-core AMD EPYC in bf16 a matrix product gives a row the same bits for any row count and a
        decode step's attention the same bits for any left padding, while fp32 matrix products switch
        kernels by row count (1, 2-4, 5-7, ...) and change the last bits. So the real path runs on the model
        itself: a row prefilled alone is decoded ``steps`` steps alone, then beside rows of other lengths
        (merged with left padding, as continuous batching merges) in two batch sizes; every step's logits
        must be equal bit for bit, and so must the sampler's log-probs. Random prompts up to ~600 tokens; under a second for a 135M model.
        """
        rng = torch.Generator().manual_seed(0)
        settings = SamplingSettings(max_tokens=steps + 1, temperature=0.0, ignore_eos=True, logprobs=True)
        lengths = (200, 300, 17, 610, 128)
        prompts = [torch.randint(0, self.vocab_size, (n,), generator=rng).tolist() for n in lengths]
        saved = dict(self.stats)

        def trace(companions: Sequence[int]) -> list[torch.Tensor]:
            """The logits row 0 (prompt 0) sees before each token, decoded beside ``companions``."""
            self.chunk_cache.clear()  # every chunk computed here, in this company
            batch = merge_all(self._prefill_chunked([_Request(f"probe-{index}", prompts[index], settings,  # type: ignore[arg-type]
                                                              _NeverDone(), 0.0)
                                                     for index in (*companions[:1], 0, *companions[1:])]),
                              self.model.config)
            slot = next(i for i, row in enumerate(batch.rows) if row.request.request_id == "probe-0")
            row = batch.rows[slot]
            seen = [batch.logits[slot].clone()]
            for _ in range(steps):
                self._step(batch, threading.Event())
                seen.append(batch.logits[slot].clone())
            return [*seen, torch.tensor(row.output.log_probs)]  # the sampler's log-probs too

        try:
            with self._model_lock, torch.inference_mode():
                alone = trace(())
                company = [trace((1,)), trace((3, 1, 2, 4))]
        finally:
            self.stats.update(saved)
            self.chunk_cache.clear()  # the probe's random prompts
        return all(torch.equal(a, b) for other in company for a, b in zip(alone, other, strict=True))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs into the model's parameters in place; return how many were copied.

        This is how the trainer's updated weights reach the rollout model. Every pair is checked before any
        is copied, so a bad name or shape leaves the model untouched. Tied aliases (``lm_head.weight`` of a
        tied model) are accepted. Waits for a running batch to finish: call it between rollouts.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a shape that differs from the parameter's.
        """
        params = dict(self.model.named_parameters(remove_duplicate=False))
        staged: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        for name, tensor in weights:
            param = params.get(name)
            if param is None:
                close = [known for known in params if known.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]][:3]
                raise KeyError(f"load_weights: the model has no parameter {name!r} (similar: {close})")
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(
                    f"load_weights: {name!r} has shape {tuple(tensor.shape)}; the model's is {tuple(param.shape)}"
                )
            staged.append((param, tensor))
        with self._model_lock, torch.no_grad():
            for param, tensor in staged:
                param.copy_(tensor.to(device=param.device, dtype=param.dtype))
            self.prefix_cache.clear()  # cached keys/values belong to the old weights
            self.turn_cache.clear()
            self.chunk_cache.clear()
        self.stats["weight_loads"] += 1
        return len(staged)

    async def aclose(self) -> None:
        """Stop serving: queued requests and the running batch end with ``stop_reason="aborted"``.

        The running batch stops after its current decode step and returns the tokens it has so far (as
        vLLM does on abort); queued requests get no tokens. Later ``generate`` calls raise.
        """
        if self._closed:
            return
        self._closed = True
        if self._stop_batch is not None:
            self._stop_batch.set()
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done():
                request.future.set_result(TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted"))
                self.stats["aborted"] += 1
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if self._loop is asyncio.get_running_loop():
            assert self._wakeup is not None
            self._wakeup.set()
            await task
        else:  # closed from another loop: it cannot await the task, so it only cancels it
            task.cancel()

    async def __aenter__(self) -> HFGenerator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- request intake -------------------------------------------------------------------------------------

    def _checked_prompt(self, prompt_ids: Sequence[int], max_tokens: int) -> list[int]:
        if isinstance(prompt_ids, torch.Tensor) or hasattr(prompt_ids, "__array__"):
            prompt_ids = prompt_ids.tolist()  # type: ignore[union-attr]
        prompt = list(prompt_ids)
        if not prompt:
            raise ValueError("prompt_ids is empty: a response needs at least one prompt token")
        for token in prompt:
            if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= token < self.vocab_size:
                raise ValueError(f"prompt_ids must hold integers in [0, {self.vocab_size}); got {token!r}")
        if self.max_positions is not None and len(prompt) + max_tokens > self.max_positions:
            raise ValueError(
                f"prompt_ids ({len(prompt)} tokens) + sampling_params.max_tokens ({max_tokens}) = "
                f"{len(prompt) + max_tokens} exceeds the model's max_position_embeddings ({self.max_positions})"
            )
        return [int(token) for token in prompt]

    def _ensure_serving(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """Start the batching task on ``loop`` (again, if an earlier loop has gone away)."""
        if self._task is not None and not self._task.done() and self._loop is loop:
            assert self._wakeup is not None
            return self._wakeup
        if self._loop is not None and self._loop is not loop:
            self._pending.clear()  # futures of a previous (closed) loop can never be resolved
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._task = loop.create_task(self._serve(self._wakeup), name="hf-generator-batcher")
        return self._wakeup

    # -- serving ----------------------------------------------------------------------------------------------

    async def _serve(self, wakeup: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        batch: list[_Request] = []
        try:
            while not self._closed:
                if not self._pending:
                    wakeup.clear()
                    await wakeup.wait()
                    continue
                await self._wait_for_company(loop, wakeup)
                batch = self._take_batch()
                if batch:
                    await self._run_stream(batch, loop)
                batch = []
        except Exception as exc:  # a bug here must not leave callers awaiting forever
            logger.exception("HFGenerator: the batching task failed")
            for request in [*batch, *self._pending]:
                if not request.future.done():
                    error = GenerationError(f"the batching task failed: {exc!r}")
                    error.__cause__ = exc
                    request.future.set_exception(error)
            self._pending.clear()  # the task ends here; the next generate() starts a fresh one

    async def _wait_for_company(self, loop: asyncio.AbstractEventLoop, wakeup: asyncio.Event) -> None:
        """Wait until the batch is full or ``batch_wait_s`` has passed since its first request arrived.

        Measured from arrival, so requests that queued up during the previous batch start at once.
        """
        if self._alone(self._pending[0]):
            return  # decoded on its own: no company to wait for
        deadline = self._pending[0].arrived + self.batch_wait_s
        while len(self._pending) < self.max_batch_size and not self._closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            wakeup.clear()
            try:
                await asyncio.wait_for(wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _take_batch(self, limit: int | None = None, *, join: bool = False) -> list[_Request]:
        """Up to ``limit`` (default ``max_batch_size``) queued requests whose callers still wait.

        Called from the event loop to start a batch and from the worker thread to admit requests into a
        running one (``join``); a deque's ``popleft``/``append`` are safe across the two threads. A request that
        must be decoded alone (:meth:`_alone`) is taken only as a batch of its own, and never joins other rows.
        """
        limit = self.max_batch_size if limit is None else limit
        batch: list[_Request] = []
        while len(batch) < limit:
            try:
                if (batch or join) and self._alone(self._pending[0]):
                    break  # it starts the next batch, alone
                request = self._pending.popleft()
            except IndexError:
                break
            if not request.future.done():  # the caller may have been cancelled while queued
                batch.append(request)
                if self._alone(request):
                    break
        return batch

    def _isolated(self, request: _Request) -> bool:
        """Whether ``request`` is prefilled alone with its whole prompt, no cached keys/values used or kept
        (``batch_invariant_greedy`` and a greedy request)."""
        return self.batch_invariant_greedy and request.settings.greedy

    def _alone(self, request: _Request) -> bool:
        """Whether ``request`` is also decoded in a batch of its own: isolated, on a machine whose decode steps
        do not compute a row alike in any company (``rows_independent``)."""
        return self._isolated(request) and not self.rows_independent

    async def _run_stream(self, first: list[_Request], loop: asyncio.AbstractEventLoop) -> None:
        stop = self._stop_batch = threading.Event()
        self.stats["streams"] += 1
        try:
            await asyncio.to_thread(self._decode, first, stop, loop)
        except asyncio.CancelledError:
            stop.set()  # the loop is going away: let the worker thread finish early
            raise
        finally:
            self._stop_batch = None

    def _answer(self, loop: asyncio.AbstractEventLoop, request: _Request, output: TokenOutput | BaseException) -> None:
        """Resolve ``request``'s future on its event loop (from the worker thread) with a result or an error."""
        def resolve() -> None:
            if request.future.done():
                return
            if isinstance(output, BaseException):
                request.future.set_exception(output)
            else:
                request.future.set_result(output)

        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is left to answer
            loop.call_soon_threadsafe(resolve)

    def _fail(self, loop: asyncio.AbstractEventLoop, requests: Iterable[_Request], exc: BaseException) -> None:
        self.stats["failed_batches"] += 1
        requests = list(requests)
        logger.warning("HFGenerator: a batch of %d requests failed: %r", len(requests), exc)
        for request in requests:
            error = GenerationError(f"generation failed for request {request.request_id!r}: {exc!r}")
            error.__cause__ = exc
            self._answer(loop, request, error)

    # -- decoding (worker thread) ------------------------------------------------------------------------------

    def _decode(self, first: list[_Request], stop: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        """Decode ``first`` and, with continuous batching, every request that arrives while it runs.

        A stream: at each decode step's boundary, queued requests (up to ``max_batch_size`` rows in all) are
        prefilled and merged into the running rows, and rows that finished are answered at once, so an
        episode's next turn can join the batch its previous turn left. Without continuous batching the rows
        of ``first`` are decoded alone and answered together when the last one ends.
        """
        held: list[tuple[_Request, TokenOutput]] = []  # answers kept for the end (continuous batching off)
        with self._model_lock, torch.inference_mode():
            running: RunningBatch | None = None
            joining = first
            while True:
                # counted step by step, so a caller answered mid-stream already sees the time spent for it
                started = time.perf_counter()
                if joining:
                    fresh = self._prefill_groups(joining, loop, joined=running is not None)
                    if fresh:  # one merge for the running rows and every prefilled group
                        merged = merge_all([*([running] if running is not None else []), *fresh],
                                           self.model.config, row_capacity=self.max_batch_size)
                        if running is not None:  # the joiners written into the running cache's free slots?
                            self.stats["joins_in_place" if merged.cache is running.cache else "joins_copied"] += 1
                        running = merged
                        self.stats["max_rows"] = max(self.stats["max_rows"], len(running))
                if running is None:
                    self.stats["model_seconds"] += time.perf_counter() - started
                    break
                try:
                    done = self._step(running, stop)
                except Exception as exc:
                    self._fail(loop, [row.request for row in running.rows], exc)
                    running = None
                    done = []
                self.stats["model_seconds"] += time.perf_counter() - started
                for request, output in done:
                    if self.continuous_batching:
                        self._answer(loop, request, output)
                    else:
                        held.append((request, output))
                if running is not None and not len(running):
                    running = None
                joining = []
                if self.continuous_batching and not stop.is_set():
                    room = self.max_batch_size - (len(running) if running is not None else 0)
                    alone = running is not None and any(self._alone(row.request) for row in running.rows)
                    # a stream whose rows all ended has every row free, so it takes whatever waits
                    joining = self._take_batch(room, join=running is not None) \
                        if room >= self.join_free_rows and not alone else []
                # without continuous batching a batch ends when its rows do; the serving task starts the next
                if running is None and not joining:
                    break
        for request, output in held:
            self._answer(loop, request, output)

    def _prefill_groups(self, requests: list[_Request], loop: asyncio.AbstractEventLoop, *,
                        joined: bool) -> list[RunningBatch]:
        """Prefill ``requests``: isolated ones (:meth:`_isolated`) in chunks, the rest together; the batches
        whose prefill worked (a failed group's callers get the error; the others go on)."""
        shared = [r for r in requests if not self._isolated(r)]
        isolated = [r for r in requests if self._isolated(r)]
        prefilled: list[RunningBatch] = []
        for group, prefill in ((shared, self._prefill), (isolated, self._prefill_chunked)):
            if not group:
                continue
            try:
                fresh = prefill(group)
            except Exception as exc:  # the running rows' state is untouched: they go on
                self._fail(loop, group, exc)
                continue
            prefilled += fresh if isinstance(fresh, list) else [fresh]
            self._count_rows(len(group), joined=joined)
        return prefilled

    def _count_rows(self, rows: int, *, joined: bool) -> None:
        self.stats["batches"] += 1
        self.stats["rows"] += rows
        if joined:
            self.stats["joined_running"] += rows

    def _keep_turn(self, batch: RunningBatch, slot: int) -> None:
        """Copy the stopped row at ``slot``'s real keys/values after its shared prefix into the turn cache.

        The cache holds the row's prompt and every generated token but the last (sampled, never fed); the
        row's mask marks its real columns (in token order), so padding is left behind wherever it sits.
        """
        row = batch.rows[slot]
        token_ids = row.request.prompt_ids + row.output.token_ids[:-1]
        columns = batch.mask[slot].nonzero().squeeze(-1)[row.prefix_len:]
        if len(columns) != len(token_ids) - row.prefix_len:  # the layout invariant; never expected to fail
            logger.warning("HFGenerator: turn cache skipped a row (%d real columns for %d tokens)",
                           len(columns), len(token_ids) - row.prefix_len)
            return
        layers = [(layer.keys[slot].index_select(1, columns), layer.values[slot].index_select(1, columns))
                  for layer in batch.cache.layers]
        self.turn_cache.store(token_ids, row.prefix_len, layers)

    def _prefill(self, batch: list[_Request]) -> RunningBatch:
        """Prefill the left-padded prompts of ``batch``: the rows, their keys/values and next-token logits.

        Not for batch_invariant_greedy's greedy requests: those go to :meth:`_prefill_chunked`.

        Position ids count real tokens only (padding gets 0 and is masked), so a row's numbers do not
        depend on how much padding its batch-mates forced on it: greedy output is batch-invariant up to
        floating-point effects of the batch shape.
        """
        from agentevolver.backends.cpu.kv_cache import new_cache  # imports transformers

        # A prefix shared by every row is prefilled once (or reused from earlier batches); rows are laid out
        # as [prefix | left padding | rest of the prompt], the mask hides the padding and the position ids
        # count real tokens, so each row computes what it would alone.
        cached = self.prefix_cache.lookup([r.prompt_ids for r in batch], self.model)
        prefix_len, cache = cached if cached is not None else (0, new_cache(self.model.config))
        # A row continuing a conversation whose earlier turn ran here takes that turn's keys/values; the
        # batch lays rows out as [prefix | padding | taken part | padding | new tokens] (.turn_cache).
        taken = [self.turn_cache.take(r.prompt_ids, prefix_len) for r in batch] \
            if self.turn_cache.enabled else [None] * len(batch)
        # The new-token block is as wide as the row that needs most; a row with more kept than that uses only
        # what fills the block, so the batch is never wider than without the cache.
        width = max(len(r.prompt_ids) - prefix_len - (0 if e is None else e.cached_len)
                    for r, e in zip(batch, taken, strict=True))
        reused = [max(0, len(r.prompt_ids) - prefix_len - width) if e is not None else 0
                  for r, e in zip(batch, taken, strict=True)]
        middle = max(reused)
        if middle:
            _append_taken(cache, taken, reused, middle)
        start = prefix_len + middle  # the first column of the new tokens
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(batch), start + width), dtype=torch.long, device=self.device)
        mask[:, :prefix_len] = 1
        for row, request in enumerate(batch):
            rest = request.prompt_ids[prefix_len + reused[row]:]
            mask[row, start - reused[row]:start] = 1
            input_ids[row, width - len(rest):] = torch.tensor(rest, dtype=torch.long)
            mask[row, start + width - len(rest):] = 1
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, start:]
        self.stats["prefix_cached_tokens"] += prefix_len * len(batch)
        self.stats["turn_cached_tokens"] += sum(reused)
        self.stats["prompt_tokens"] += sum(len(r.prompt_ids) for r in batch)
        sampler = RowSampler(
            [r.settings for r in batch], [r.prompt_ids for r in batch], vocab_size=self.vocab_size,
            shared_rng=self._rng, device=self.device, constraints=[r.constraint for r in batch],
        )
        logits = self._forward_prompt(input_ids, mask, positions, cache, cached=prefix_len > 0)
        rows = [Row(request, self._new_output(request.settings), prefix_len) for request in batch]
        return RunningBatch(rows, cache, mask, positions[:, -1:], logits, sampler)

    def _forward_prompt(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, *,
                        cached: bool) -> torch.Tensor:
        """Feed a prefill's new tokens (``input_ids``, after the cache's columns); the last position's logits.

        Where every row has cached columns it can attend to (``cached``: a shared prefix, so no query is masked
        from everything) and the block is short, it goes through the decode attention in passes of at most
        :data:`.decode_attention.MAX_QUERIES` tokens (two at most). Why: SDPA's prefill first copies the whole
        cache, transposed and repeated for every query head, whatever the block's length; for an episode's next
        turn (~26 new tokens after ~1k cached, 16 rows, bf16) that cost more than the tokens themselves
        (docs/benchmarks.md). Longer blocks, and fp32 (SDPA throughout), take one SDPA pass as before."""
        width = input_ids.shape[1]
        passes = -(-width // decode_attention.MAX_QUERIES)
        if not (self.decode_attention and cached and passes <= 2):
            return self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                              past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1, :]
        start = mask.shape[1] - width  # the block's first column
        step = -(-width // passes)
        with decode_attention.draft_blocks():
            for first in range(0, width, step):
                last = min(first + step, width)
                logits = self.model(input_ids=input_ids[:, first:last], attention_mask=mask[:, :start + last],
                                    position_ids=positions[:, first:last], past_key_values=cache, use_cache=True,
                                    logits_to_keep=1).logits
        return logits[:, -1, :]

    def _prefill_chunked(self, requests: list[_Request]) -> list[RunningBatch]:
        """Prefill each prompt as if alone, in chunks at fixed positions (:mod:`.chunk_cache`); one batch per row.

        Whole chunks another prompt computed are reused, the others computed and kept, so a row's numbers depend
        on its prompt only. Rows advance in lockstep: the rows whose next chunk starts at the same position and
        has the same length share one forward pass (every row of it then has the same past length and chunk
        length, so no padding: each row's products and attention are the ones it would run alone, which the
        start-up probe checks). A batch of greedy validation prompts then costs about one pass per chunk
        position instead of one per prompt.
        """
        from agentevolver.backends.cpu.kv_cache import new_cache  # imports transformers

        size = self.chunk_cache.chunk_tokens
        rows = [_ChunkedRow(request, new_cache(self.model.config)) for request in requests]
        while True:
            live = [row for row in rows if row.logits is None]
            if not live:
                break
            for row in live:  # reuse what is kept (never the chunk holding the last token)
                while row.start + size < len(row.prompt):
                    entry = self.chunk_cache.get(row.prompt[:row.start + size])
                    if entry is None:
                        break
                    row.waiting.append(entry)
                    row.start += size
                    self.stats["prefix_cached_tokens"] += size
            start = min(row.start for row in live)
            groups: dict[int, list[_ChunkedRow]] = {}
            for row in live:
                if row.start == start:
                    groups.setdefault(min(size, len(row.prompt) - start), []).append(row)
            for length, group in groups.items():
                self._prefill_chunk(group, start, length)
        self.stats["prompt_tokens"] += sum(len(row.prompt) for row in rows)
        batches = []
        for row in rows:
            request = row.request
            sampler = RowSampler([request.settings], [row.prompt], vocab_size=self.vocab_size,
                                 shared_rng=self._rng, device=self.device, constraints=[request.constraint])
            mask = torch.ones((1, len(row.prompt)), dtype=torch.long, device=self.device)
            positions = torch.tensor([[len(row.prompt) - 1]], dtype=torch.long, device=self.device)
            assert row.logits is not None
            batches.append(RunningBatch([Row(request, self._new_output(request.settings), 0)], row.cache, mask,
                                        positions, row.logits, sampler))
        return batches

    def _prefill_chunk(self, group: list[_ChunkedRow], start: int, length: int) -> None:
        """One forward pass over the chunk ``[start, start + length)`` of every row of ``group`` (each row's
        keys/values cover exactly ``start`` tokens so far); keeps whole chunks, sets a row's logits after its
        last token."""
        from agentevolver.backends.cpu.kv_cache import new_cache  # imports transformers

        for row in group:
            row.flush()
        if len(group) == 1:
            cache = group[0].cache
        elif start == 0:
            cache = new_cache(self.model.config)
        else:  # the rows' pasts side by side: the same length, so no padding
            cache = new_cache(self.model.config)
            for index, layers in enumerate(zip(*(row.cache.layers for row in group), strict=True)):
                cache.update(torch.cat([layer.keys for layer in layers]),
                             torch.cat([layer.values for layer in layers]), index)
        end = start + length
        self.stats["chunk_passes"] += 1
        logits = self.model(
            input_ids=torch.tensor([row.prompt[start:end] for row in group], dtype=torch.long, device=self.device),
            attention_mask=torch.ones((len(group), end), dtype=torch.long, device=self.device),
            position_ids=torch.arange(start, end, device=self.device)[None].expand(len(group), -1),
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        ).logits[:, -1, :]
        for slot, row in enumerate(group):
            chunk = [(layer.keys[slot, :, start:end], layer.values[slot, :, start:end]) for layer in cache.layers]
            if len(group) > 1:
                for index, (keys, values) in enumerate(chunk):
                    row.cache.update(keys[None], values[None], index)
            if length == self.chunk_cache.chunk_tokens and self.chunk_cache.max_bytes:
                self.chunk_cache.store(row.prompt[:end], [(keys.clone(), values.clone()) for keys, values in chunk])
            row.start = end
            if end == len(row.prompt):
                row.logits = logits[slot:slot + 1]

    def _new_output(self, settings: SamplingSettings) -> _Output:
        stops = settings.stop_token_ids if settings.ignore_eos else (*self.eos_token_ids, *settings.stop_token_ids)
        return _Output(frozenset(stops))

    def _step(self, batch: RunningBatch, stop: threading.Event) -> list[tuple[_Request, TokenOutput]]:
        """Sample every row's next token; return the rows that ended (answers), and feed the others'.

        Rows that ended leave the batch (their keys/values go to the turn cache first); the rest get one
        forward pass, after which ``batch`` is ready to sample again.
        """
        exclude = [row.exclude for row in batch.rows]
        tokens, logprobs = batch.sampler(batch.logits, exclude if any(t is not None for t in exclude) else None)
        for row in batch.rows:
            row.exclude = None
        token_list = tokens.tolist()
        logprob_list = logprobs.tolist() if logprobs is not None else []
        keep: list[int] = []
        ended: list[int] = []
        for slot, row in enumerate(batch.rows):
            output, request = row.output, row.request
            _append(output, request, token_list[slot], logprob_list[slot] if request.settings.logprobs else None)
            if output.stop_reason is None and (stop.is_set() or request.future.done()):
                output.stop_reason = "aborted"
            if output.stop_reason is None:
                keep.append(slot)
                continue
            ended.append(slot)
            if output.stop_reason != "aborted" and self.turn_cache.enabled and not self._isolated(request):
                self._keep_turn(batch, slot)
        answers = [self._finished(batch.rows[slot]) for slot in ended]
        if len(keep) < len(batch):
            order = batch.drop(keep)
            tokens = tokens[torch.tensor(order, dtype=torch.long, device=self.device)]
        if keep:
            drafts = self._drafts(batch)
            if drafts is not None:
                return answers + self._check_drafts(batch, tokens, drafts)
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones((len(keep), 1))], dim=-1)
            batch.positions = batch.positions + 1
            batch.logits = self.model(
                input_ids=tokens[:, None], attention_mask=batch.mask, position_ids=batch.positions,
                past_key_values=batch.cache, use_cache=True,
            ).logits[:, -1, :]
            self.stats["decode_steps"] += 1
        return answers

    def _drafts(self, batch: RunningBatch) -> list[list[int]] | None:
        """Every row's prompt-lookup draft (``draft_tokens``), or None where this batch decodes token by token:
        speculation off, a penalty or constraint in the batch, a timing-proof greedy row, or no row with a draft."""
        if not self.draft_tokens or not batch.sampler.takes_drafts \
                or any(self._isolated(row.request) for row in batch.rows):
            return None
        drafts = []
        for row in batch.rows:
            output, request = row.output, row.request
            if row.lookup is None:
                row.lookup = PromptLookup(request.prompt_ids)
            row.lookup.extend(output.token_ids[len(row.lookup) - len(request.prompt_ids):])
            room = request.settings.max_tokens - len(output.token_ids)  # drafts past max_tokens are never kept
            drafts.append(row.lookup.propose(min(self.draft_tokens, room)))
        return drafts if any(drafts) else None

    def _check_drafts(self, batch: RunningBatch, tokens: torch.Tensor,
                      drafts: list[list[int]]) -> list[tuple[_Request, TokenOutput]]:
        """One forward pass over every row's sampled token and its draft; keep the accepted drafted tokens.

        A row's block columns stay real up to its last fed token that it keeps (the layout rule of
        :mod:`.running_batch`: masked columns may sit anywhere), the rest become padding; its next logits are
        those after that token. A row that ends on an accepted token (a stop id, ``max_tokens``) leaves with it,
        its column hidden, so its cache holds every token but the last, as after a plain step. Returns the
        answers of those rows.
        """
        rows = len(batch)
        width = 1 + max(len(draft) for draft in drafts)
        block = tokens[:, None].repeat(1, width)
        block_mask = batch.mask.new_zeros((rows, width))
        for slot, draft in enumerate(drafts):
            block[slot, 1:1 + len(draft)] = torch.tensor(draft, dtype=block.dtype, device=block.device)
            block_mask[slot, :1 + len(draft)] = 1
        batch.mask = torch.cat([batch.mask, block_mask], dim=-1)
        offsets = torch.arange(1, width + 1, device=batch.positions.device)
        with decode_attention.draft_blocks():  # the block takes the decode path, not SDPA's prefill kernel
            logits = self.model(
                input_ids=block, attention_mask=batch.mask, position_ids=batch.positions + offsets[None, :],
                past_key_values=batch.cache, use_cache=True,
            ).logits
        self.stats["decode_steps"] += 1
        self.stats["draft_passes"] += 1
        self.stats["drafted_tokens"] += sum(len(draft) for draft in drafts)
        checked = batch.sampler.verify(logits, drafts)
        keep: list[int] = []
        ended: list[int] = []
        fed = torch.zeros(rows, dtype=torch.long)  # block columns each row keeps real
        last = torch.zeros(rows, dtype=torch.long)  # the block position whose logits come next
        for slot, (row, draft, (accepted, logprobs)) in enumerate(zip(batch.rows, drafts, checked, strict=True)):
            output, request = row.output, row.request
            self.stats["accepted_tokens"] += accepted
            kept = 0
            for index in range(accepted):
                _append(output, request, draft[index], logprobs[index] if request.settings.logprobs else None)
                kept += 1
                if output.stop_reason is not None:
                    break
            if output.stop_reason is not None:
                fed[slot] = kept  # the ending token is not fed: its column goes
                ended.append(slot)
                continue
            fed[slot] = 1 + kept
            last[slot] = kept
            if kept < len(draft) and not request.settings.greedy:
                row.exclude = draft[kept]  # rejected: the next sample is drawn without it
            keep.append(slot)
        columns = torch.arange(width)[None, :]
        batch.mask[:, -width:] = (columns < fed[:, None]).to(batch.mask.dtype)
        batch.positions = batch.positions + fed[:, None].to(batch.positions.dtype)
        batch.logits = logits[torch.arange(rows), last]
        for slot in ended:
            if self.turn_cache.enabled:
                self._keep_turn(batch, slot)
        answers = [self._finished(batch.rows[slot]) for slot in ended]
        if ended:
            batch.drop(keep)
        return answers

    def _finished(self, row: Row) -> tuple[_Request, TokenOutput]:
        output, settings = row.output, row.request.settings
        self.stats["generated_tokens"] += len(output.token_ids)
        self.stats["aborted"] += output.stop_reason == "aborted"
        return row.request, TokenOutput(
            token_ids=output.token_ids,
            log_probs=output.log_probs if settings.logprobs else None,
            stop_reason=output.stop_reason,
        )


def _append(output: _Output, request: _Request, token: int, logprob: float | None) -> None:
    """Add a generated token (and its log-prob, when asked for) to ``output``; end it on a stop id
    ("completed") or at ``max_tokens`` ("length")."""
    output.token_ids.append(token)
    if logprob is not None:
        output.log_probs.append(logprob)
    if token in output.stop_ids:
        output.stop_reason = "completed"
    elif len(output.token_ids) >= request.settings.max_tokens:
        output.stop_reason = "length"


def _append_taken(cache: Any, taken: Sequence[TurnEntry | None], reused: Sequence[int], width: int) -> None:
    """Append a ``width``-column section to every layer of ``cache``: in each row the first ``reused`` of
    its taken entry's keys/values, right-aligned; zeros (masked) elsewhere."""
    from agentevolver.backends.cpu.kv_cache import GrowingLayer  # imports transformers

    sample = next(entry for entry in taken if entry is not None)
    for index, (keys0, _) in enumerate(sample.layers):
        heads, _, dim = keys0.shape
        keys = keys0.new_zeros((len(taken), heads, width, dim))
        values = keys0.new_zeros((len(taken), heads, width, dim))
        for row, (entry, count) in enumerate(zip(taken, reused, strict=True)):
            if entry is not None and count:
                entry_keys, entry_values = entry.layers[index]
                keys[row, :, width - count:] = entry_keys[:, :count]
                values[row, :, width - count:] = entry_values[:, :count]
        layer = cache.layers[index]
        if isinstance(layer, GrowingLayer):
            layer.append(keys, values)  # stored only: no contiguous copies for a prefill to throw away
        else:
            cache.update(keys, values, index)


def _eos_token_ids(*sources: Any) -> list[int]:
    """EOS ids named by any of ``sources`` (generation config, model config, tokenizer), in that order."""
    ids: list[int] = []
    for source in sources:
        value = getattr(source, "eos_token_id", None)
        for token in value if isinstance(value, list | tuple) else [value]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise ValueError("the model names no eos_token_id (generation_config, config or tokenizer)")
    return ids
