"""The one OpenAI-compatible chat client that every LLM role (judge, task explorer/summariser/filter/grader,
experience summariser, context clipper) goes through.

Why one client: retries, timeouts, concurrency limits, API-key handling and error messages are the same
problem for every role, and getting them subtly different per role is how a run dies at hour three on a
single 502. The wire is the ``openai`` SDK (its own retries off); the policy is :mod:`.retry` (tenacity).

Semantics in short (see docs/llm.md):

* retried: connection errors, timeouts, HTTP 408/409/429/5xx, and a 200 reply that is not a usable chat
  completion (no choices, not JSON); full-jitter exponential backoff, up to ``max_retries`` retries;
* not retried: any other 4xx (400, 401, 403, 404, 422, ...): :class:`LLMError` at once, saying what to fix;
* every failure reaching a caller is an :class:`LLMError` (the SDK exception is chained as its cause);
* at most ``max_concurrency`` requests in flight per client on the sync side (across threads) and per
  event loop on the async side; a request waiting out a backoff does not hold a slot;
* a role that passes ``schema=`` gets it sent as ``response_format`` when the endpoint takes it
  (``structured_output``, :mod:`.structured_output`); a server that refuses it is asked again without it,
  once per endpoint, and the result says which format the reply was generated under.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import openai
from openai import AsyncOpenAI, OpenAI
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from agentevolver.client.closing import ClosingContext
from agentevolver.client.http import loop_local
from agentevolver.client.llm_config import LLMConfig, LLMEndpointConfig
from agentevolver.client.retry import FullJitterBackoff, RetryableFailure, is_retryable_status, retry_after_s
from agentevolver.client.structured_output import FormatState, ReplySchema, is_format_refusal
from agentevolver.errors import LLMError

__all__ = ["PLACEHOLDER_API_KEY", "ChatResult", "LLMClient", "LLMClients", "Usage", "client_for_role"]

logger = logging.getLogger(__name__)

#: Sent when the configured env var is unset: OpenAI-compatible local servers (vLLM without --api-key,
#: llama.cpp) ignore the key, but the SDK and some proxies insist on an Authorization header.
PLACEHOLDER_API_KEY = "EMPTY"

_MAX_DETAIL_CHARS = 400

# Close tasks scheduled from synchronous close() inside a running loop; held so they are not GC'd mid-way.
_background_closes: set[asyncio.Task[None]] = set()

Message = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts the server reported (0 when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The first choice of a chat completion, plus what it cost.

    ``attempts`` is how many HTTP attempts the call took (1 = no retry): roles log it, and tests assert it.
    ``text`` is ``""`` when the server sent no content (e.g. only tool calls). ``structured`` is the
    ``response_format`` type the reply was generated under (``json_schema`` / ``json_object``), None for
    free text; ``format_fallback`` is True when the server refused the format and this reply is free text.
    """

    text: str
    finish_reason: str | None
    usage: Usage
    model: str
    attempts: int
    structured: str | None = None
    format_fallback: bool = False


class _FormatRefused(Exception):
    """The server refused the request's ``response_format`` (HTTP 400/422 naming it); not retried as is."""


@dataclass(slots=True)
class _LoopState:
    """Async resources bound to one event loop: the SDK client (its httpx pool) and the concurrency gate.

    ``guard`` is a started async generator whose ``finally`` closes ``client``. Event loops close every
    pending async generator in ``shutdown_asyncgens()`` (``asyncio.run`` and ``asyncio.Runner`` call it just
    before closing the loop), so the pool is closed on its own loop even when the caller never calls
    :meth:`LLMClient.aclose` -- instead of leaking sockets bound to a dead loop.
    """

    loop: asyncio.AbstractEventLoop
    client: AsyncOpenAI
    slots: asyncio.Semaphore
    guard: AsyncGenerator[None, None]


async def _close_on_loop_shutdown(client: AsyncOpenAI) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await client.close()


class LLMClient(ClosingContext):
    """Chat with one OpenAI-compatible endpoint, with retries, timeouts and a concurrency limit.

    Thread-safe and usable from any number of event loops (the async side keeps one SDK client and one
    semaphore per loop, created lazily). One HTTP connection pool per client (per loop for async) is reused
    across calls. ``close()`` / ``aclose()`` release the pools; a later call simply opens new ones.
    Picklable (e.g. into a Ray actor): the copy re-reads the API key from the environment where it lands.
    """

    def __init__(self, endpoint: LLMEndpointConfig, *, name: str | None = None) -> None:
        """``name`` is the key under ``llm.endpoints`` (used only to make error messages point at the config)."""
        self._endpoint = endpoint
        self._name = name
        self._config_key = f"llm.endpoints.{name}" if name else "llm.endpoints.<name>"
        self._where = (
            f"LLM endpoint {name or ''}".rstrip() + f" (base_url={endpoint.base_url}, model={endpoint.model})"
        )
        env = endpoint.api_key_env
        key = os.environ.get(env) if env else None
        self._key_is_set = bool(key)
        if not key:
            logger.debug(
                "%s: env var %s is unset, sending a placeholder API key",
                self._where,
                env or "(none configured)",
            )
        self._api_key = key or PLACEHOLDER_API_KEY
        self._lock = threading.Lock()
        self._formats = FormatState(endpoint.structured_output)
        self._sync: OpenAI | None = None
        self._sync_slots = threading.BoundedSemaphore(endpoint.max_concurrency)
        self._loop_states: dict[asyncio.AbstractEventLoop, _LoopState] = {}

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def for_role(cls, llm_config: LLMConfig | Mapping[str, Any], role: str) -> LLMClient:
        """A new client for the endpoint ``llm.roles.<role>`` names; :class:`ConfigError` if the role is unknown."""
        config = _as_llm_config(llm_config)
        name, endpoint = config.endpoint_for(role)
        return cls(endpoint, name=name)

    def __reduce__(self) -> tuple[Any, ...]:
        # Locks, pools and loop-bound state cannot cross a process boundary; the config can.
        return (_rebuild_client, (self._endpoint, self._name))

    def __repr__(self) -> str:
        return f"LLMClient({self._where})"

    @property
    def endpoint(self) -> LLMEndpointConfig:
        return self._endpoint

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def model(self) -> str:
        return self._endpoint.model

    @property
    def structured_kind(self) -> str | None:
        """The ``response_format`` a request with a schema gets now (None = free text): roles word their
        prompt for it (e.g. the judge asks for JSON instead of lines)."""
        return self._formats.kind()

    @property
    def format_counts(self) -> dict[str, int]:
        """Requests sent with a ``response_format`` and refusals that fell back to free text, so far."""
        return dict(self._formats.counts)

    # ------------------------------------------------------------------ public API
    def chat(
        self,
        messages: Sequence[Message],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        schema: ReplySchema | None = None,
        **extra: Any,
    ) -> ChatResult:
        """Send one chat completion request and return its first choice; blocks the calling thread.

        ``temperature`` / ``max_tokens`` default to the endpoint's config. ``extra`` keys are sent verbatim in
        the JSON body (``top_p``, ``seed``, ``response_format``, vLLM's ``chat_template_kwargs``, ...).
        ``schema`` is the reply's shape, sent as ``response_format`` when the endpoint takes it (see the
        module docstring); the caller still validates the reply. Raises :class:`LLMError` on a
        non-retryable failure or when retries run out.
        """
        kind = self._format_kind(schema, extra)
        if kind is not None:
            assert schema is not None
            request = self._request(messages, temperature, max_tokens, stop,
                                    {**extra, "response_format": schema.response_format(kind)})
            try:
                result = self._chat_sync(request, format_added=True)
            except _FormatRefused as refused:
                self._on_refusal(kind, str(refused))
            else:
                self._formats.sent()
                return replace(result, structured=kind)
        result = self._chat_sync(self._request(messages, temperature, max_tokens, stop, extra))
        return replace(result, format_fallback=True) if kind is not None else result

    def _chat_sync(self, request: dict[str, Any], format_added: bool = False) -> ChatResult:
        attempts = 0
        try:
            for attempt in self._retrying(Retrying):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    with self._sync_slots:
                        response = self._send_sync(request, format_added)
                    return self._to_result(response, attempts)
        except RetryableFailure as failure:
            raise self._exhausted(failure, attempts) from (failure.__cause__ or failure)
        raise AssertionError("unreachable: tenacity returned without a result or an exception")

    async def achat(
        self,
        messages: Sequence[Message],
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        schema: ReplySchema | None = None,
        **extra: Any,
    ) -> ChatResult:
        """Async :meth:`chat`: same arguments, result and errors; limited per event loop."""
        kind = self._format_kind(schema, extra)
        if kind is not None:
            assert schema is not None
            request = self._request(messages, temperature, max_tokens, stop,
                                    {**extra, "response_format": schema.response_format(kind)})
            try:
                result = await self._chat_async(request, format_added=True)
            except _FormatRefused as refused:
                self._on_refusal(kind, str(refused))
            else:
                self._formats.sent()
                return replace(result, structured=kind)
        result = await self._chat_async(self._request(messages, temperature, max_tokens, stop, extra))
        return replace(result, format_fallback=True) if kind is not None else result

    async def _chat_async(self, request: dict[str, Any], format_added: bool = False) -> ChatResult:
        state = await self._loop_state()
        attempts = 0
        try:
            async for attempt in self._retrying(AsyncRetrying):
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    async with state.slots:
                        response = await self._send_async(state.client, request, format_added)
                    return self._to_result(response, attempts)
        except RetryableFailure as failure:
            raise self._exhausted(failure, attempts) from (failure.__cause__ or failure)
        raise AssertionError("unreachable: tenacity returned without a result or an exception")

    def close(self) -> None:
        """Close the sync pool and every async pool this client can still reach without awaiting.

        An async pool on a loop running in another thread is closed there (scheduled, not awaited); one on a
        loop that is already closed was closed by that loop's shutdown or is simply dropped. Prefer
        ``await aclose()`` from async code so the current loop's pool is closed before returning.
        """
        with self._lock:
            sync, self._sync = self._sync, None
            states = list(self._loop_states.values())
            self._loop_states.clear()
        if sync is not None:
            sync.close()
        for state in states:
            _close_state_without_awaiting(state)

    async def aclose(self) -> None:
        """Close the current event loop's pool (awaited), then everything :meth:`close` handles."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loop_states.pop(loop, None)
        if state is not None:
            await state.guard.aclose()
        self.close()

    # ------------------------------------------------------------------ internals
    def _format_kind(self, schema: ReplySchema | None, extra: Mapping[str, Any]) -> str | None:
        """The format to send with this request: none without a schema or when the caller set its own."""
        if schema is None or "response_format" in extra:
            return None
        return self._formats.kind()

    def _on_refusal(self, kind: str, message: str) -> None:
        """Remember a refused format (``auto``: fall back, logged once) or fail (an explicit mode)."""
        key = f"{self._config_key}.structured_output"
        if self._endpoint.structured_output != "auto":
            raise LLMError(f"{self._where} refused response_format {kind!r} ({_short(message)}); this server "
                           f"does not take it: set {key} to auto or off")
        if self._formats.refused(message):
            logger.warning("%s does not take response_format %s (%s); its roles fall back to free text, parsed "
                           "and re-asked (set %s: off to skip the attempt)", self._where, kind, _short(message), key)

    def _sdk_kwargs(self) -> dict[str, Any]:
        return {
            "api_key": self._api_key,
            "base_url": self._endpoint.base_url,
            "timeout": self._endpoint.timeout_s,
            "max_retries": 0,  # retries are ours (tenacity), so they are counted and reported
        }

    def _sync_client(self) -> OpenAI:
        with self._lock:
            if self._sync is None:
                self._sync = OpenAI(**self._sdk_kwargs())
            return self._sync

    async def _loop_state(self) -> _LoopState:
        """The async client + semaphore of the running loop, created on first use in that loop.

        One set per loop because asyncio primitives and httpx's async pool are bound to the loop they were
        first used on (see :func:`~agentevolver.client.http.loop_local`).
        """
        with self._lock:
            state, fresh = loop_local(self._loop_states, self._new_loop_state)
        if fresh:
            await anext(state.guard)  # start it, so the loop tracks it for shutdown_asyncgens()
        return state

    def _new_loop_state(self, loop: asyncio.AbstractEventLoop) -> _LoopState:
        client = AsyncOpenAI(**self._sdk_kwargs())
        return _LoopState(loop=loop, client=client, slots=asyncio.Semaphore(self._endpoint.max_concurrency),
                          guard=_close_on_loop_shutdown(client))

    def _request(
        self,
        messages: Sequence[Message],
        temperature: float | None,
        max_tokens: int | None,
        stop: str | Sequence[str] | None,
        extra: Mapping[str, Any],
    ) -> dict[str, Any]:
        if isinstance(messages, str | bytes) or not messages:
            raise ValueError(
                "messages must be a non-empty sequence of {'role': ..., 'content': ...} mappings"
            )
        request: dict[str, Any] = {
            "model": self._endpoint.model,
            "messages": [dict(m) for m in messages],
            "temperature": self._endpoint.temperature if temperature is None else temperature,
            "max_tokens": self._endpoint.max_tokens if max_tokens is None else max_tokens,
        }
        if stop is not None:
            request["stop"] = stop if isinstance(stop, str) else list(stop)
        if extra:
            request["extra_body"] = dict(extra)
        return request

    def _retrying(self, kind: type[Retrying] | type[AsyncRetrying]) -> Any:
        ep = self._endpoint
        return kind(
            stop=stop_after_attempt(ep.max_retries + 1),
            wait=FullJitterBackoff(ep.backoff_initial_s, ep.backoff_max_s),
            retry=retry_if_exception_type(RetryableFailure),
            before_sleep=self._log_retry,
            reraise=True,
        )

    def _log_retry(self, retry_state: RetryCallState) -> None:
        failure = retry_state.outcome.exception() if retry_state.outcome is not None else None
        delay = retry_state.next_action.sleep if retry_state.next_action is not None else 0.0
        logger.info(
            "%s: attempt %d/%d failed (%s); retrying in %.2f s",
            self._where,
            retry_state.attempt_number,
            self._endpoint.max_retries + 1,
            failure,
            delay,
        )

    def _send_sync(self, request: dict[str, Any], format_added: bool) -> Any:
        try:
            return self._sync_client().chat.completions.create(**request)
        except Exception as exc:
            raise self._classify(exc, format_added) from exc

    async def _send_async(self, client: AsyncOpenAI, request: dict[str, Any], format_added: bool) -> Any:
        try:
            return await client.chat.completions.create(**request)
        except Exception as exc:
            raise self._classify(exc, format_added) from exc

    def _to_result(self, response: Any, attempts: int) -> ChatResult:
        """Turn an SDK response into a :class:`ChatResult`; a reply without a usable choice is retryable."""
        choices = getattr(response, "choices", None)
        if not choices:
            raise RetryableFailure(f"HTTP 200 without choices (malformed reply: {_short(response)})")
        choice = choices[0]
        message = getattr(choice, "message", None)
        if message is None:
            raise RetryableFailure(
                f"HTTP 200 whose first choice has no message (malformed reply: {_short(response)})"
            )
        usage = getattr(response, "usage", None)
        return ChatResult(
            text=getattr(message, "content", None) or "",
            finish_reason=getattr(choice, "finish_reason", None),
            usage=Usage(
                prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            ),
            model=getattr(response, "model", None) or self._endpoint.model,
            attempts=attempts,
        )

    def _classify(self, exc: Exception, format_added: bool = False) -> Exception:
        """Map an exception from the SDK call to :class:`RetryableFailure`, :class:`_FormatRefused` (the server
        does not take the ``response_format`` this client added) or a final :class:`LLMError`."""
        ep = self._endpoint
        if (format_added and isinstance(exc, openai.APIStatusError)
                and is_format_refusal(exc.status_code, exc.body, exc.message)):
            return _FormatRefused(f"HTTP {exc.status_code}: {_short(exc.message)}")
        if isinstance(exc, openai.APITimeoutError):
            return RetryableFailure(f"no reply within timeout_s={ep.timeout_s} s")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc.__context__
            detail = f": {cause}" if cause is not None and str(cause) else ""
            return RetryableFailure(f"could not connect to {ep.base_url}{detail}")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            detail = _short(exc.message)
            if is_retryable_status(status):
                return RetryableFailure(
                    f"HTTP {status}: {detail}", retry_after_s=retry_after_s(exc.response.headers)
                )
            return LLMError(f"{self._where} answered HTTP {status} ({detail}); {self._fix_for(status)}")
        if isinstance(exc, json.JSONDecodeError):
            return RetryableFailure(f"reply body is not JSON ({exc})")
        return LLMError(
            f"{self._where}: request failed with {type(exc).__name__}: {_short(str(exc))}; check the request "
            f"arguments and that {ep.base_url} is an OpenAI-compatible server"
        )

    def _fix_for(self, status: int) -> str:
        """What the user should change for a non-retryable HTTP status: the point of the error message."""
        ep, key = self._endpoint, self._config_key
        if status == 401:
            if ep.api_key_env is None:
                return (
                    f"the endpoint wants an API key: set {key}.api_key_env to the name of an env var "
                    "and export the key in it"
                )
            if not self._key_is_set:
                return f"set the env var {ep.api_key_env} to the API key (it is unset, so a placeholder was sent)"
            return f"the key in env var {ep.api_key_env} was rejected: check it is valid for {ep.base_url}"
        if status == 403:
            return (
                f"the API key (env var {ep.api_key_env}) may not use model {ep.model!r}: check the key's "
                f"permissions or {key}.model"
            )
        if status == 404:
            return (
                f"check {key}.model (does the server serve {ep.model!r}?) and {key}.base_url "
                "(OpenAI-compatible base URLs usually end in /v1)"
            )
        if status in (400, 413, 422):
            return (
                "the server rejected the request itself: check the messages and sampling arguments "
                f"(is max_tokens={ep.max_tokens} plus the prompt within the model's context window? "
                "are extra keyword arguments supported by this server?)"
            )
        return f"HTTP {status} is not retryable; check {key} and the server's logs"

    def _exhausted(self, failure: RetryableFailure, attempts: int) -> LLMError:
        ep, key = self._endpoint, self._config_key
        return LLMError(
            f"{self._where} failed after {attempts} attempt(s) (max_retries={ep.max_retries}); last error: "
            f"{failure.reason}. Check that the server is up and reachable at {ep.base_url}; if it is only slow "
            f"or rate-limited, raise {key}.timeout_s or {key}.max_retries, or lower {key}.max_concurrency."
        )


class LLMClients(ClosingContext):
    """One :class:`LLMClient` per endpoint, shared by every role routed to it.

    Roles on the same endpoint then share its connection pool and its ``max_concurrency`` limit, which is
    what the limit is for: protecting one server. (``client_for_role`` builds an independent client each
    call; use it for one-off tools.)
    """

    def __init__(self, llm_config: LLMConfig | Mapping[str, Any]) -> None:
        self.config = _as_llm_config(llm_config)
        self._lock = threading.Lock()
        self._clients: dict[str, LLMClient] = {}

    def for_role(self, role: str) -> LLMClient:
        """The shared client for ``llm.roles.<role>``; :class:`ConfigError` if the role is unknown."""
        name, endpoint = self.config.endpoint_for(role)
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = LLMClient(endpoint, name=name)
            return client

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            client.close()

    async def aclose(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            await client.aclose()


def client_for_role(llm_config: LLMConfig | Mapping[str, Any], role: str) -> LLMClient:
    """A new client for the endpoint that ``llm.roles.<role>`` names (see :meth:`LLMClient.for_role`)."""
    return LLMClient.for_role(llm_config, role)


def _as_llm_config(llm_config: LLMConfig | Mapping[str, Any]) -> LLMConfig:
    """Accept the validated model, a plain dict, or the Hydra/OmegaConf ``cfg.llm`` node."""
    if isinstance(llm_config, LLMConfig):
        return llm_config
    from omegaconf import OmegaConf  # local: only needed when handed a Hydra node

    if OmegaConf.is_config(llm_config):
        llm_config = OmegaConf.to_container(llm_config, resolve=True)  # type: ignore[assignment]
    return LLMConfig.model_validate(llm_config)


def _rebuild_client(endpoint: LLMEndpointConfig, name: str | None) -> LLMClient:
    return LLMClient(endpoint, name=name)


def _close_state_without_awaiting(state: _LoopState) -> None:
    """Close an async pool from synchronous code, on the pool's own loop where that loop still lives."""
    loop = state.loop
    if loop.is_closed():
        return  # its shutdown_asyncgens() already closed the pool (or the loop was closed without one)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop.is_running():
        if running is loop:
            # called synchronously from inside that loop: schedule, as we cannot block it
            task = loop.create_task(state.guard.aclose())
            _background_closes.add(task)
            task.add_done_callback(_background_closes.discard)
        else:
            asyncio.run_coroutine_threadsafe(state.guard.aclose(), loop)
    elif running is None:
        loop.run_until_complete(state.guard.aclose())


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _MAX_DETAIL_CHARS else text[: _MAX_DETAIL_CHARS - 3] + "..."
