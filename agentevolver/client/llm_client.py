"""The one OpenAI-compatible chat client that every LLM role (judge, task explorer/summariser/filter/grader,
experience summariser, context clipper) goes through.

Why one client: retries, timeouts, concurrency limits, API-key handling and error messages are the same
problem for every role, and getting them subtly different per role is how a run dies at hour three on a
single 502. The wire is the ``openai`` SDK (its own retries off); the policy is :mod:`.retry` (tenacity).

Semantics in short (see docs/llm.md):

* retried: connection errors, timeouts, HTTP 408/409/429/5xx, and a 200 reply that is not a usable chat
  completion (no choices, not JSON); full-jitter exponential backoff, up to ``max_retries`` retries;
* not retried: any other 4xx (400, 401, 403, 404, 422, ...): :class:`LLMError` at once, saying what to fix
  (:mod:`.llm_errors`);
* every failure reaching a caller is an :class:`LLMError` (the SDK exception is chained as its cause);
* at most ``max_concurrency`` requests in flight per client on the sync side (across threads) and per
  event loop on the async side; a request waiting out a backoff does not hold a slot;
* a role that passes ``schema=`` gets it sent as ``response_format`` when the endpoint takes it
  (``structured_output``, :mod:`.structured_output`); a server that refuses it is asked again without it,
  once per endpoint, and the result says which format the reply was generated under.

``chat`` and ``achat`` are one operation (:meth:`LLMClient._chat_flow`: request, retries, format fallback,
reply) run by a blocking or an async driver (:mod:`.sansio`); they differ only in the SDK client that sends
and the gate that limits it. The request and reply themselves are :mod:`.llm_wire`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from openai import AsyncOpenAI, OpenAI
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from agentevolver.client.closing import ClosingContext
from agentevolver.client.http import loop_local
from agentevolver.client.llm_config import LLMConfig, LLMEndpointConfig
from agentevolver.client.llm_errors import EndpointFailures, FormatRefused
from agentevolver.client.llm_wire import ChatResult, Message, Usage, build_request, read_reply, short
from agentevolver.client.loop_pools import LoopPool, close_without_awaiting, open_loop_pool
from agentevolver.client.retry import FullJitterBackoff, RetryableFailure
from agentevolver.client.sansio import Flow, Send, Sleep, arun, run
from agentevolver.client.structured_output import FormatState, ReplySchema

__all__ = ["PLACEHOLDER_API_KEY", "ChatResult", "LLMClient", "LLMClients", "Usage", "client_for_role"]

logger = logging.getLogger(__name__)

#: Sent when the configured env var is unset: OpenAI-compatible local servers (vLLM without --api-key,
#: llama.cpp) ignore the key, but the SDK and some proxies insist on an Authorization header.
PLACEHOLDER_API_KEY = "EMPTY"


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
        env = endpoint.api_key_env
        key = os.environ.get(env) if env else None
        self._failures = EndpointFailures(endpoint, name, key_is_set=bool(key))
        self._where = self._failures.where
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
        self._loop_pools: dict[asyncio.AbstractEventLoop, LoopPool] = {}

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
    def chat(self, messages: Sequence[Message], *, temperature: float | None = None,
             max_tokens: int | None = None, stop: str | Sequence[str] | None = None,
             schema: ReplySchema | None = None, **extra: Any) -> ChatResult:
        """Send one chat completion request and return its first choice; blocks the calling thread.

        ``temperature`` / ``max_tokens`` default to the endpoint's config. ``extra`` keys are sent verbatim in
        the JSON body (``top_p``, ``seed``, ``response_format``, vLLM's ``chat_template_kwargs``, ...).
        ``schema`` is the reply's shape, sent as ``response_format`` when the endpoint takes it (see the
        module docstring); the caller still validates the reply. Raises :class:`LLMError` on a
        non-retryable failure or when retries run out. Safe to call from inside a running event loop (it
        blocks that loop's thread, as any blocking call does, but never starts or needs a loop).
        """
        return run(self._chat_flow(messages, temperature, max_tokens, stop, schema, extra), self._send)

    async def achat(self, messages: Sequence[Message], *, temperature: float | None = None,
                    max_tokens: int | None = None, stop: str | Sequence[str] | None = None,
                    schema: ReplySchema | None = None, **extra: Any) -> ChatResult:
        """Async :meth:`chat`: same arguments, result and errors; limited per event loop."""
        flow = self._chat_flow(messages, temperature, max_tokens, stop, schema, extra)
        return await arun(flow, self._asend)

    def close(self) -> None:
        """Close the sync pool and every async pool this client can still reach without awaiting.

        An async pool on a loop running in another thread is closed there (scheduled, not awaited); one on a
        loop that is already closed was closed by that loop's shutdown or is simply dropped. Prefer
        ``await aclose()`` from async code so the current loop's pool is closed before returning.
        """
        with self._lock:
            sync, self._sync = self._sync, None
            pools = list(self._loop_pools.values())
            self._loop_pools.clear()
        if sync is not None:
            sync.close()
        for pool in pools:
            close_without_awaiting(pool)

    async def aclose(self) -> None:
        """Close the current event loop's pool (awaited), then everything :meth:`close` handles."""
        loop = asyncio.get_running_loop()
        with self._lock:
            pool = self._loop_pools.pop(loop, None)
        if pool is not None:
            await pool.guard.aclose()
        self.close()

    # ------------------------------------------------------------------ the operation (one body, two drivers)
    def _chat_flow(
        self,
        messages: Sequence[Message],
        temperature: float | None,
        max_tokens: int | None,
        stop: str | Sequence[str] | None,
        schema: ReplySchema | None,
        extra: Mapping[str, Any],
    ) -> Flow[ChatResult]:
        """One chat call: with the endpoint's ``response_format`` for ``schema`` where it takes one, asked
        again without it when the server refuses it; the result says which it was."""
        kind = self._format_kind(schema, extra)
        if kind is not None:
            assert schema is not None
            request = build_request(self._endpoint, messages, temperature, max_tokens, stop,
                                    {**extra, "response_format": schema.response_format(kind)})
            try:
                result = yield from self._attempts(request, format_added=True)
            except FormatRefused as refused:
                self._on_refusal(kind, str(refused))
            else:
                self._formats.sent()
                return replace(result, structured=kind)
        request = build_request(self._endpoint, messages, temperature, max_tokens, stop, extra)
        result = yield from self._attempts(request)
        return replace(result, format_fallback=True) if kind is not None else result

    def _attempts(self, request: dict[str, Any], format_added: bool = False) -> Flow[ChatResult]:
        """``request`` under the retry policy: tenacity decides whether and how long to wait, the driver
        waits (so an async backoff does not block its loop), each failure is sorted by :mod:`.llm_errors`."""
        backoffs: list[float] = []
        attempts = 0
        try:
            for attempt in self._retrying(sleep=backoffs.append):
                if backoffs:
                    yield Sleep(float(backoffs.pop()))
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    try:
                        response = yield Send(request)
                    except Exception as exc:
                        raise self._failures.classify(exc, format_added) from exc
                    return read_reply(response, attempts, self._endpoint.model)
        except RetryableFailure as failure:
            raise self._failures.exhausted(failure, attempts) from (failure.__cause__ or failure)
        raise AssertionError("unreachable: tenacity returned without a result or an exception")

    def _send(self, request: dict[str, Any]) -> Any:
        """Blocking transport: the client's pool, at most ``max_concurrency`` in flight across threads."""
        with self._sync_slots:
            return self._sync_client().chat.completions.create(**request)

    async def _asend(self, request: dict[str, Any]) -> Any:
        """Async transport: the running loop's pool, at most ``max_concurrency`` in flight on that loop."""
        pool = await self._loop_pool()
        async with pool.slots:
            return await pool.client.chat.completions.create(**request)

    # ------------------------------------------------------------------ internals
    def _format_kind(self, schema: ReplySchema | None, extra: Mapping[str, Any]) -> str | None:
        """The format to send with this request: none without a schema or when the caller set its own."""
        if schema is None or "response_format" in extra:
            return None
        return self._formats.kind()

    def _on_refusal(self, kind: str, message: str) -> None:
        """Remember a refused format (``auto``: fall back, logged once) or fail (an explicit mode)."""
        if self._endpoint.structured_output != "auto":
            raise self._failures.format_refused(kind, message)
        if self._formats.refused(message):
            logger.warning("%s does not take response_format %s (%s); its roles fall back to free text, "
                           "parsed and re-asked (set %s.structured_output: off to skip the attempt)",
                           self._where, kind, short(message), self._failures.config_key)

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

    async def _loop_pool(self) -> LoopPool:
        """The async client + semaphore of the running loop, created on first use in that loop."""
        with self._lock:
            pool, fresh = loop_local(self._loop_pools, self._new_loop_pool)
        if fresh:
            await anext(pool.guard)  # start it, so the loop tracks it for shutdown_asyncgens()
        return pool

    def _new_loop_pool(self, loop: asyncio.AbstractEventLoop) -> LoopPool:
        return open_loop_pool(loop, AsyncOpenAI(**self._sdk_kwargs()), self._endpoint.max_concurrency)

    def _retrying(self, **options: Any) -> Retrying:
        ep = self._endpoint
        return Retrying(
            stop=stop_after_attempt(ep.max_retries + 1),
            wait=FullJitterBackoff(ep.backoff_initial_s, ep.backoff_max_s),
            retry=retry_if_exception_type(RetryableFailure),
            before_sleep=self._log_retry,
            reraise=True,
            **options,
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
