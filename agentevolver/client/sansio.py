"""One operation, written once, run by a blocking or by an asyncio driver (the sans-I/O pattern).

Why: :meth:`~agentevolver.client.llm_client.LLMClient.chat` and ``achat`` must build the same request, retry
the same failures after the same backoff, fall back from a refused ``response_format`` the same way and read
the reply the same way. Written as a generator that asks for its I/O instead of doing it, the operation is one
body: it yields a :class:`Send` (a request) or a :class:`Sleep` (a backoff), receives the reply at the
``yield`` -- or has the transport's exception raised there -- and returns its result. :func:`run` and
:func:`arun` only perform the steps, with a blocking and with an async transport. (httpx's
``Auth.auth_flow`` is the same pattern.)

Not an async core behind a sync facade: a sync caller may already be inside a running event loop (verl's
async agent loop, a FastAPI handler), where ``asyncio.run`` fails, and a thread hop per call would cost a
thread and a second event loop for every blocking request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

__all__ = ["Flow", "Send", "Sleep", "Step", "arun", "run"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Send:
    """Send one request: ``request`` is the keyword arguments of the transport's call."""

    request: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait out a backoff before the next attempt (no concurrency slot is held meanwhile)."""

    seconds: float


Step: TypeAlias = Send | Sleep

#: An operation: yields :class:`Step` s, receives each request's reply (or has its failure raised at the
#: ``yield``), returns the result.
Flow: TypeAlias = Generator[Step, Any, _T]


class _Steps(Iterator[Step], Generic[_T]):
    """Iterating resumes the flow with the outcome of the step before (``reply`` or ``error``) and yields the
    next step; once the flow returns, its value is in ``result``."""

    def __init__(self, flow: Flow[_T]) -> None:
        self._flow = flow
        self.reply: Any = None
        self.error: Exception | None = None
        self.result: _T | None = None

    def __next__(self) -> Step:
        reply, error, self.reply, self.error = self.reply, self.error, None, None
        try:
            return self._flow.send(reply) if error is None else self._flow.throw(error)
        except StopIteration as done:
            self.result = done.value
            raise


def run(flow: Flow[_T], send: Callable[[dict[str, Any]], Any]) -> _T:
    """Run ``flow`` blocking the calling thread: ``send(request)`` performs a request, ``time.sleep`` a
    backoff. The flow's result, or the exception it let through."""
    steps = _Steps(flow)
    with contextlib.closing(flow):
        for step in steps:
            try:
                steps.reply = send(step.request) if isinstance(step, Send) else time.sleep(step.seconds)
            except Exception as exc:  # raised at the flow's yield: it handles it or lets it through
                steps.error = exc
    return steps.result  # type: ignore[return-value]


async def arun(flow: Flow[_T], send: Callable[[dict[str, Any]], Awaitable[Any]]) -> _T:
    """Async :func:`run`: ``await send(request)`` performs a request, ``asyncio.sleep`` a backoff; a
    cancellation is not raised into the flow, it closes it."""
    steps = _Steps(flow)
    with contextlib.closing(flow):
        for step in steps:
            try:
                pending = send(step.request) if isinstance(step, Send) else asyncio.sleep(step.seconds)
                steps.reply = await pending
            except Exception as exc:
                steps.error = exc
    return steps.result  # type: ignore[return-value]
