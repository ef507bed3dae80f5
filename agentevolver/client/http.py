"""HTTP plumbing shared by the clients of the framework's own JSON services (environment, memory).

Both clients need the same machinery: a bearer token read from a named environment variable, one sync
connection pool plus one async pool per event loop, full-jitter retries (tenacity with
:class:`~agentevolver.client.retry.FullJitterBackoff`) of the attempts a per-route policy calls safe, errors
that carry the service's ``{code, message, field}``, answers parsed into the service's wire models, and one
body per operation for the sync and the async API (:data:`Flow`). It lives here once so the two clients
cannot drift apart on it. What differs per service -- what a good answer looks like, which failures a repeat
may cure -- is each client's :meth:`ServiceClient._accept` and :meth:`ServiceClient._repeatable`.

An operation is written once, as a generator (the sans-I/O pattern of httpx's ``Auth.auth_flow``): it
yields each :class:`Call` it needs, receives the answer at the ``yield`` (or the failure, raised there), and
returns its result. :meth:`ServiceClient._run` drives it with the sync pool, :meth:`ServiceClient._arun`
with the running loop's async pool, so a client's ``create`` and ``acreate`` are one-line facades over the
same request building, failure handling and answer parsing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn, Protocol, TypeAlias, TypeVar

import httpx
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from agentevolver.client.closing import ClosingContext
from agentevolver.client.retry import FullJitterBackoff, RetryableFailure
from agentevolver.errors import AgentEvolverError

__all__ = [
    "NOT_PROCESSED",
    "Call",
    "ClientSettings",
    "Flow",
    "ServiceClient",
    "ServiceClientError",
    "ServiceFailure",
    "describe_failure",
    "error_detail",
    "loop_local",
]

#: Statuses meaning "the request was not processed; the same request may succeed later".
NOT_PROCESSED = frozenset({429, 503})

_T = TypeVar("_T")
_Model = TypeVar("_Model", bound=BaseModel)


@dataclass(frozen=True)
class Call:
    """One request an operation asks for: ``options`` go to httpx (``json=``, ``content=``, ``headers=``);
    ``idempotent`` says whether a repeat after a timeout or a 5xx is safe (the retry policy reads it)."""

    method: str
    route: str
    idempotent: bool
    options: Mapping[str, Any] = field(default_factory=dict)


#: An operation, written once for the sync and the async API: yields :class:`Call` s, receives each answer
#: (what :meth:`ServiceClient._accept` returns) or has its failure raised at the ``yield``, returns the result.
Flow: TypeAlias = Generator[Call, Any, _T]


class ServiceClientError(AgentEvolverError):
    """A request to a service failed for good; ``status`` / ``code`` / ``field`` come from the service."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.field = status, code, field


class ServiceFailure(RetryableFailure):
    """A retryable failed attempt, remembering the HTTP status / service error for the final message."""

    def __init__(self, reason: str, *, status: int | None = None, code: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(reason)
        self.status, self.code, self.field = status, code, field


class ClientSettings(Protocol):
    """What :class:`ServiceClient` reads from a client's settings (both settings dataclasses have it)."""

    @property
    def timeout_s(self) -> float: ...

    @property
    def max_retries(self) -> int: ...

    @property
    def backoff_initial_s(self) -> float: ...

    @property
    def backoff_max_s(self) -> float: ...

    @property
    def auth_token_env(self) -> str | None: ...


def loop_local(entries: dict[asyncio.AbstractEventLoop, _T],
               make: Callable[[asyncio.AbstractEventLoop], _T]) -> tuple[_T, bool]:
    """The running loop's entry of ``entries`` (made on first use, then ``True``); closed loops' are dropped.

    asyncio primitives and httpx's async pools are bound to the loop that first used them, so sharing one
    across ``asyncio.run`` calls fails; one per loop does not, and dropping the entries of closed loops keeps
    a long-lived client from accumulating them. The caller holds its lock around this.
    """
    loop = asyncio.get_running_loop()
    for dead in [lp for lp in entries if lp.is_closed()]:
        del entries[dead]
    entry = entries.get(loop)
    if entry is not None:
        return entry, False
    entry = entries[loop] = make(loop)
    return entry, True


def error_detail(response: httpx.Response) -> tuple[str | None, str | None, str]:
    """``(code, field, message)`` of a failed answer.

    Read from the service's ``error: {code, message, field}`` (this framework's services), else from
    FastAPI's default ``detail`` (a string, or validation problems with a ``loc``: the reference's
    environment service and a real ReMe server answer so), else the start of the body text, else the status.
    """
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        message = detail.get("message") or response.text[:300] or f"HTTP {response.status_code}"
        return detail.get("code"), detail.get("field"), str(message)
    fastapi_detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(fastapi_detail, str) and fastapi_detail:
        return None, None, fastapi_detail[:300]
    if isinstance(fastapi_detail, list) and fastapi_detail and isinstance(fastapi_detail[0], dict):
        first = fastapi_detail[0]
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        return first.get("type"), ".".join(loc) or None, str(first.get("msg", "invalid request"))
    return None, None, response.text[:300] or f"HTTP {response.status_code}"


def describe_failure(service_name: str, base_url: str, where: str, status: int, code: str | None,
                     field: str | None, message: str) -> str:
    """What a user reads when a request failed: which service, which route, the service's own message led
    by the field it names, then the status and code, e.g. ``environment service rejected /step:
    messages.role: must be 'assistant' (HTTP 422 bad_action; http://127.0.0.1:8080)``."""
    verb = "failed on" if status >= 500 else "rejected"
    lead = f"{field}: " if field and not message.startswith(field) else ""
    tag = " ".join(part for part in (f"HTTP {status}", code) if part)
    return f"{service_name} {verb} {where.removeprefix(base_url) or where}: {lead}{message} ({tag}; {base_url})"


class ServiceClient(ClosingContext):
    """Base of a client of one JSON service. Thread-safe; usable from any number of event loops.

    Subclasses set :attr:`service_name`, :attr:`error_type` and :attr:`log`, implement :meth:`_accept` (and
    :meth:`_repeatable` where a 5xx may pass), write each operation once as a :data:`Flow` and expose it
    through :meth:`_run` / :meth:`_arun`. ``stats`` counts requests (attempts) and retries for the trainer.
    """

    #: How log lines name the service ("environment service").
    service_name: ClassVar[str]
    #: What a request that failed for good raises (the client's public error class).
    error_type: ClassVar[type[ServiceClientError]]
    #: The client module's logger, so retries are logged under the client's name.
    log: ClassVar[logging.Logger]
    #: Appended to the message of a transport failure that is not retried.
    not_retried_note: ClassVar[str] = ""

    settings: ClientSettings

    def __init__(self, settings: ClientSettings, base_url: str, *, max_connections: int,
                 max_keepalive_connections: int) -> None:
        self.settings = settings
        self._base = base_url
        token = os.environ.get(settings.auth_token_env) if settings.auth_token_env else None
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = httpx.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s))
        # Idle pooled connections expire well before the server's keep-alive (uvicorn: 30 s as the services
        # start it, 5 s by default), so a request never races the server closing its side.
        self._limits = httpx.Limits(max_connections=max_connections,
                                    max_keepalive_connections=max_keepalive_connections, keepalive_expiry=2.0)
        self._lock = threading.Lock()
        self._sync: httpx.Client | None = None
        self._async: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        #: Counts of what happened, for the trainer's metrics.
        self.stats: dict[str, int] = {"requests": 0, "retries": 0}

    # ------------------------------------------------------------------ pools
    def _pool_options(self) -> dict[str, Any]:
        return {"base_url": self._base, "headers": self._headers, "timeout": self._timeout,
                "limits": self._limits}

    def _sync_client(self) -> httpx.Client:
        with self._lock:
            if self._sync is None:
                self._sync = httpx.Client(**self._pool_options())
            return self._sync

    def _async_client(self) -> httpx.AsyncClient:
        with self._lock:
            client, _ = loop_local(self._async, lambda _loop: httpx.AsyncClient(**self._pool_options()))
            return client

    def close(self) -> None:
        """Close the sync pool (async pools close with :meth:`aclose` on their loop)."""
        with self._lock:
            client, self._sync = self._sync, None
        if client is not None:
            client.close()

    async def aclose(self) -> None:
        """Close this loop's async pool and the sync pool."""
        with self._lock:
            client = self._async.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        self.close()

    def healthy(self) -> bool:
        """True if ``/healthz`` answers 200 now (no retries)."""
        try:
            return self._sync_client().get("/healthz", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    # ------------------------------------------------------------------ request core
    def _accept(self, where: str, response: httpx.Response, idempotent: bool) -> Any:
        """What a request returns for ``response``; raises :meth:`_refusal`'s error for a failed answer."""
        raise NotImplementedError

    def _repeatable(self, status: int, code: str | None) -> bool:
        """Whether an idempotent request that failed with ``status`` / ``code`` may succeed if sent again
        (429 and 503 always may: the request was not processed)."""
        return False

    def _refusal(self, where: str, response: httpx.Response, idempotent: bool) -> Exception:
        """The error for a failed answer, in the service's words: :class:`ServiceFailure` (tried again) when
        the request was not processed or an idempotent one may succeed again, else :attr:`error_type`."""
        status = response.status_code
        code, field_name, message = error_detail(response)
        reason = describe_failure(self.service_name, self._base, where, status, code, field_name, message)
        retry = status in NOT_PROCESSED or (idempotent and self._repeatable(status, code))
        kind = ServiceFailure if retry else self.error_type
        return kind(reason, status=status, code=code, field=field_name)

    def _parse(self, route: str, answer: Any, model: type[_Model]) -> _Model:
        """``answer`` (a JSON value, or a response whose body is one) as the service's wire ``model``; an
        answer that is not one raises :attr:`error_type` naming the route and the model."""
        try:
            return model.model_validate(answer.json() if isinstance(answer, httpx.Response) else answer)
        except (ValueError, ValidationError) as err:
            raise self.error_type(f"{self._base}{route}: the answer is not a {model.__name__}: {err}") from err

    def _transport_failure(self, where: str, error: httpx.HTTPError, idempotent: bool) -> Exception:
        """No answer: a failed connect never reached the service, so it is retried on every route; a timeout
        or a dropped connection may have been processed, so only idempotent routes retry it."""
        retry = isinstance(error, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout) or (
            idempotent and isinstance(error, httpx.TransportError))
        reason = f"{where}: {type(error).__name__}: {error or 'no detail'}"
        return ServiceFailure(reason) if retry else self.error_type(f"{reason}{self.not_retried_note}")

    def _retrying(self, kind: type[Retrying] | type[AsyncRetrying]) -> Any:
        s = self.settings
        return kind(stop=stop_after_attempt(s.max_retries + 1), wait=FullJitterBackoff(s.backoff_initial_s,
                    s.backoff_max_s), retry=retry_if_exception_type(ServiceFailure),
                    before_sleep=self._count_retry, retry_error_callback=self._give_up)

    def _count_retry(self, state: RetryCallState) -> None:
        self.stats["retries"] += 1
        failure = state.outcome.exception() if state.outcome else None
        self.log.warning("%s request failed (attempt %d), retrying: %s", self.service_name,
                         state.attempt_number, getattr(failure, "reason", failure))

    def _give_up(self, state: RetryCallState) -> NoReturn:
        """Retries ran out: tenacity calls this when the last attempt failed with a ServiceFailure."""
        failure = state.outcome.exception() if state.outcome else None
        assert isinstance(failure, ServiceFailure)
        raise self.error_type(f"{failure.reason} (gave up after {state.attempt_number} attempts)",
                              status=failure.status, code=failure.code, field=failure.field) from failure

    def _send(self, method: str, route: str, *, idempotent: bool, **kwargs: Any) -> Any:
        """One request under the retry policy (``kwargs`` go to httpx): what :meth:`_accept` returns."""
        client, where = self._sync_client(), f"{self._base}{route}"

        def attempt() -> Any:
            self.stats["requests"] += 1
            try:
                response = client.request(method, route, **kwargs)
            except httpx.HTTPError as err:
                raise self._transport_failure(where, err, idempotent) from err
            return self._accept(where, response, idempotent)

        return self._retrying(Retrying)(attempt)

    async def _asend(self, method: str, route: str, *, idempotent: bool, **kwargs: Any) -> Any:
        """Async :meth:`_send`."""
        client, where = self._async_client(), f"{self._base}{route}"

        async def attempt() -> Any:
            self.stats["requests"] += 1
            try:
                response = await client.request(method, route, **kwargs)
            except httpx.HTTPError as err:
                raise self._transport_failure(where, err, idempotent) from err
            return self._accept(where, response, idempotent)

        return await self._retrying(AsyncRetrying)(attempt)

    # ------------------------------------------------------------------ operations
    def _answer(self, call: Call, model: type[_Model]) -> Flow[_Model]:
        """One request, its answer parsed as the service's wire ``model``."""
        answer = yield call
        return self._parse(call.route, answer, model)

    def _run(self, flow: Flow[_T]) -> _T:
        """Drive an operation (:data:`Flow`) with the sync pool; its result, or the failure it let through."""
        try:
            call = next(flow)
            while True:
                try:
                    answer = self._send(call.method, call.route, idempotent=call.idempotent, **call.options)
                except Exception as err:  # raised at the operation's yield: it handles it or lets it through
                    call = flow.throw(err)
                else:
                    call = flow.send(answer)
        except StopIteration as done:
            return done.value

    async def _arun(self, flow: Flow[_T]) -> _T:
        """Async :meth:`_run`: the same operation, driven with the running loop's pool."""
        try:
            call = next(flow)
            while True:
                try:
                    answer = await self._asend(call.method, call.route, idempotent=call.idempotent, **call.options)
                except Exception as err:
                    call = flow.throw(err)
                else:
                    call = flow.send(answer)
        except StopIteration as done:
            return done.value
