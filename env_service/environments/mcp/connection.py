"""One live connection to one MCP server, through the official SDK, callable from any thread.

Environment methods are synchronous (the service runs them on worker threads or in instance processes),
while the SDK is async and its transports must be entered and left by the same task. So every connection
of a process lives on one background event loop (:func:`_loop`), each in a task of its own that opens the
transport and the ``ClientSession``, serves until told to stop, and closes both. Callers submit coroutines
to that loop and wait with a deadline.

A stdio server's stderr goes to a temporary file, so any failure can show its last lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from env_service.environments.mcp.config import ServerConfig

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Lines of a server's stderr shown in an error.
STDERR_TAIL_LINES = 15

_LOOP_LOCK = threading.Lock()
_LOOP: asyncio.AbstractEventLoop | None = None


def _loop() -> asyncio.AbstractEventLoop:
    """The process's MCP event loop (started on first use, a daemon thread)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


class ServerError(Exception):
    """The server cannot serve: it failed to start, or died / closed the connection. ``dead`` = restart it."""

    def __init__(self, message: str, dead: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.dead = dead


class CallTimeout(Exception):
    """A tool call did not finish within the server's ``call_timeout_s``."""


@dataclass(frozen=True)
class ListedTool:
    """A tool as the server lists it."""

    name: str
    description: str
    input_schema: dict[str, Any]


class Connection:
    """A started server: its tools, ``call``, ``close``. Build with :meth:`open`."""

    def __init__(self, server: ServerConfig) -> None:
        self.server = server
        self.tools: list[ListedTool] = []
        self.instructions: str | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._dead: str | None = None
        # open for the connection's life (the server writes to it), closed in close()
        self._stderr = tempfile.NamedTemporaryFile("w+", prefix=f"mcp-{server.name}-", suffix=".stderr",  # noqa: SIM115
                                                   delete=False, encoding="utf-8")
        self._instance_dir: str | None = None
        self.in_flight = 0

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def open(cls, server: ServerConfig) -> Connection:
        """Start ``server`` and list its tools; :class:`ServerError` naming it, with its stderr tail, if not."""
        conn = cls(server)
        ready = asyncio.run_coroutine_threadsafe(conn._started(), _loop())
        try:
            ready.result(server.start_timeout_s)
        except BaseException as err:
            if isinstance(err, TimeoutError | asyncio.TimeoutError):
                what = f"did not start within {server.start_timeout_s:g} s (servers.{server.name}.start_timeout_s)"
            else:
                leaf = _leaf(err)
                what = f"failed to start ({type(leaf).__name__}: {leaf})"
            ready.cancel()
            message = conn._explain(what)  # before close: it removes the stderr file
            conn.close()
            raise ServerError(message) from err
        return conn

    async def _started(self) -> None:
        started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._serve(started), name=f"mcp-{self.server.name}")
        await started

    async def _serve(self, started: asyncio.Future[None]) -> None:
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                init = await session.initialize()
                self.instructions = getattr(init, "instructions", None)
                self.tools = await self._list_tools(session)
                self._session = session
                started.set_result(None)
                assert self._stop is not None
                await self._stop.wait()
        except BaseException as err:
            if not started.done():
                started.set_exception(err if isinstance(err, Exception) else ServerError(str(err)))
            elif self._dead is None and not (self._stop and self._stop.is_set()):
                self._dead = f"the connection ended: {type(err).__name__}: {err}"
        finally:
            self._session = None
            if self._dead is None and not (self._stop and self._stop.is_set()):
                self._dead = "the connection ended"

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        server = self.server
        if server.transport == "http":
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            return _http(server.url or "", httpx2, streamable_http_client, server.headers)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command = server.argv()
        if any("{instance_dir}" in arg for arg in command):
            self._instance_dir = tempfile.mkdtemp(prefix=f"mcp-{server.name}-")
            command = [arg.replace("{instance_dir}", self._instance_dir) for arg in command]
        params = StdioServerParameters(command=command[0], args=command[1:], env=server.stdio_env(), cwd=server.cwd)
        return stdio_client(params, errlog=self._stderr)

    @staticmethod
    async def _list_tools(session: Any) -> list[ListedTool]:
        from mcp import types

        tools: list[ListedTool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
            tools += [ListedTool(t.name, t.description or "", dict(t.input_schema or {"type": "object"}))
                      for t in page.tools]
            cursor = page.next_cursor
            if not cursor:
                return tools

    @property
    def alive(self) -> bool:
        return self._dead is None and self._session is not None

    def close(self) -> None:
        """Stop the server (the SDK closes stdin, then SIGTERM, then SIGKILL); never raises."""
        task, stop = self._task, self._stop
        if task is not None and stop is not None and not task.done():
            loop = _loop()
            loop.call_soon_threadsafe(stop.set)
            waiter = asyncio.run_coroutine_threadsafe(asyncio.wait({task}, timeout=10), loop)
            with contextlib.suppress(Exception):
                waiter.result(12)
        self._session = None
        with contextlib.suppress(OSError):
            self._stderr.close()
            Path(self._stderr.name).unlink()
        if self._instance_dir:
            shutil.rmtree(self._instance_dir, ignore_errors=True)

    # ------------------------------------------------------------------ calls
    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """``tools/call`` with the server's time limit: the SDK's ``CallToolResult``.

        :class:`CallTimeout` past ``call_timeout_s``; :class:`ServerError` (``dead``) when the server died or
        closed the connection, with its stderr tail.
        """
        session = self._session
        if not self.alive or session is None:
            raise ServerError(self._explain(self._dead or "is not running"))
        timeout = self.server.call_timeout_s
        future = asyncio.run_coroutine_threadsafe(self._call(session, name, arguments, timeout), _loop())
        self.in_flight += 1
        try:
            return future.result(timeout + 5)
        except TimeoutError as err:
            future.cancel()
            raise CallTimeout(f"tool {name!r} of MCP server {self.server.name!r} did not answer within "
                              f"{timeout:g} s (servers.{self.server.name}.call_timeout_s)") from err
        except ServerError:
            raise
        except Exception as err:
            err = _leaf(err)
            if (self._task is not None and self._task.done()) or _looks_closed(err):
                self._dead = self._dead or f"{type(err).__name__}: {err}"
                raise ServerError(self._explain(f"died or closed the connection during {name!r} "
                                                f"({type(err).__name__}: {err})")) from err
            raise
        finally:
            self.in_flight -= 1

    def ping(self, timeout: float = 5.0) -> bool:
        """Whether the server still answers (MCP ``ping``); False marks it dead, so it is restarted."""
        session = self._session
        if not self.alive or session is None:
            return False
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(session.send_ping(), timeout), _loop())
        try:
            future.result(timeout + 1)
            return True
        except Exception as err:
            self._dead = self._dead or f"it did not answer a ping ({type(_leaf(err)).__name__})"
            return False

    async def _call(self, session: Any, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        call = asyncio.ensure_future(session.call_tool(name, arguments))
        assert self._task is not None
        done, _ = await asyncio.wait({call, self._task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if call in done:
            return call.result()
        call.cancel()
        if self._task in done:
            raise ServerError(self._explain(f"died during {name!r} ({self._dead or 'the connection ended'})"))
        raise TimeoutError

    # ------------------------------------------------------------------ diagnostics
    def stderr_tail(self) -> str:
        """The last lines the server wrote to stderr ("" for HTTP servers or a silent server)."""
        with contextlib.suppress(OSError, ValueError):
            self._stderr.flush()
            lines = Path(self._stderr.name).read_text(encoding="utf-8", errors="replace").splitlines()
            return "\n".join(lines[-STDERR_TAIL_LINES:])
        return ""

    def _explain(self, what: str) -> str:
        where = " ".join(self.server.command or []) if self.server.command else self.server.url
        tail = self.stderr_tail()
        return (f"MCP server {self.server.name!r} ({where}) {what}"
                + (f"; last lines of its stderr:\n{tail}" if tail else "; it wrote nothing to stderr"))


def _leaf(err: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups: what the SDK's task groups wrap."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _looks_closed(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return any(word in text for word in ("closed", "broken", "endofstream", "connection", "eof"))


@contextlib.asynccontextmanager
async def _http(url: str, httpx2: Any, client_factory: Any, headers: dict[str, str]) -> Any:
    async with httpx2.AsyncClient(headers=headers, timeout=30.0) as http, client_factory(url, http_client=http) as streams:
        yield streams


def run_sync(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """Run ``coro`` on the MCP loop from a synchronous caller (tests and tools)."""
    return asyncio.run_coroutine_threadsafe(coro, _loop()).result(timeout)
