"""The LLM client's async resources per event loop -- SDK client and concurrency gate -- and their closing.

asyncio primitives and httpx's async pool are bound to the loop they were first used on (see
:func:`~agentevolver.client.http.loop_local`), so the async side keeps one :class:`LoopPool` per loop. Closing
one must happen on its own loop, which may be running in another thread, closed, or the caller's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from openai import AsyncOpenAI

__all__ = ["LoopPool", "close_without_awaiting", "open_loop_pool"]

# Close tasks scheduled from synchronous code inside a running loop; held so they are not GC'd mid-way.
_background_closes: set[asyncio.Task[None]] = set()


@dataclass(slots=True)
class LoopPool:
    """Async resources bound to one event loop: the SDK client (its httpx pool) and the concurrency gate.

    ``guard`` is a started async generator whose ``finally`` closes ``client``. Event loops close every
    pending async generator in ``shutdown_asyncgens()`` (``asyncio.run`` and ``asyncio.Runner`` call it just
    before closing the loop), so the pool is closed on its own loop even when the caller never calls
    ``aclose()`` -- instead of leaking sockets bound to a dead loop. Await ``anext(guard)`` once before use.
    """

    loop: asyncio.AbstractEventLoop
    client: AsyncOpenAI
    slots: asyncio.Semaphore
    guard: AsyncGenerator[None, None]


def open_loop_pool(loop: asyncio.AbstractEventLoop, client: AsyncOpenAI, max_concurrency: int) -> LoopPool:
    return LoopPool(loop=loop, client=client, slots=asyncio.Semaphore(max_concurrency),
                    guard=_close_on_loop_shutdown(client))


async def _close_on_loop_shutdown(client: AsyncOpenAI) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def close_without_awaiting(pool: LoopPool) -> None:
    """Close an async pool from synchronous code, on the pool's own loop where that loop still lives."""
    loop = pool.loop
    if loop.is_closed():
        return  # its shutdown_asyncgens() already closed the pool (or the loop was closed without one)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop.is_running():
        if running is loop:
            # called synchronously from inside that loop: schedule, as we cannot block it
            task = loop.create_task(pool.guard.aclose())
            _background_closes.add(task)
            task.add_done_callback(_background_closes.discard)
        else:
            asyncio.run_coroutine_threadsafe(pool.guard.aclose(), loop)
    elif running is None:
        loop.run_until_complete(pool.guard.aclose())
