"""The servers of a service, and the tool catalogue the episode sees.

``shared`` servers are started once per process and reused by every instance (:class:`SharedPool`); a shared
server that died or timed out is dropped and started again on the next use, so one fault costs the episodes
in flight on it, never the service. ``instance`` servers are started by the instance and stopped with it.

The catalogue maps the names the agent sees to (server, tool): a tool name that more than one server lists
gets its server's prefix (``sqlite__read_query``) on every server that lists it; unique names stay as they
are. It is computed from the servers' own ``list_tools`` answers, once per process, so class-level
``tool_schemas`` and every instance agree.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from env_service.environments.mcp.config import McpConfig, ServerConfig
from env_service.environments.mcp.connection import Connection, ListedTool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogTool:
    """One tool as the agent sees it."""

    exposed: str
    server: str
    tool: ListedTool

    def schema(self) -> dict[str, Any]:
        """OpenAI function format."""
        return {"type": "function", "function": {"name": self.exposed, "description": self.tool.description,
                                                 "parameters": self.tool.input_schema}}


class SharedPool:
    """One connection per shared server in this process, (re)started on demand."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: dict[str, Connection] = {}
        self._server_locks: dict[str, threading.Lock] = {}
        self.restarts: Counter[str] = Counter()

    def get(self, server: ServerConfig, check: bool = False) -> Connection:
        """The live connection of ``server``, starting it (again) when it is not running.

        ``check`` (at ``/create``): ping an idle server first, so a server that died between episodes is
        restarted before a new episode starts on it. Mid-episode calls do not ping: a server that dies under
        an episode fails that episode, as the contract says.
        """
        with self._lock:
            lock = self._server_locks.setdefault(server.name, threading.Lock())
        with lock:
            conn = self._conns.get(server.name)
            if conn is not None and conn.alive and (not check or conn.in_flight or conn.ping()):
                return conn
            if conn is not None:
                self.restarts[server.name] += 1
                logger.warning("MCP server %r is not running any more; starting it again", server.name)
                conn.close()
            conn = Connection.open(server)
            self._conns[server.name] = conn
            return conn

    def drop(self, server: ServerConfig, conn: Connection) -> None:
        """Stop ``conn`` (it timed out or died) so the next :meth:`get` starts a fresh server."""
        with self._lock:
            if self._conns.get(server.name) is conn:
                del self._conns[server.name]
                self.restarts[server.name] += 1
        threading.Thread(target=conn.close, name=f"mcp-close-{server.name}", daemon=True).start()

    def close_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()


#: This process's shared servers.
POOL = SharedPool()

_CATALOG_LOCK = threading.Lock()
_CATALOGS: dict[int, list[CatalogTool]] = {}


def listed_tools(server: ServerConfig) -> tuple[list[ListedTool], str | None]:
    """The tools (and instructions) of ``server``: from the shared connection, or a short-lived one."""
    if server.scope == "shared":
        conn = POOL.get(server)
        return conn.tools, conn.instructions
    conn = Connection.open(server)
    try:
        return conn.tools, conn.instructions
    finally:
        conn.close()


def build_catalog(listing: dict[str, list[ListedTool]], config: McpConfig) -> list[CatalogTool]:
    """Exposed names for every (server, tool), prefixing names that collide across servers."""
    counts = Counter(tool.name for tools in listing.values() for tool in tools)
    prefixes = {server.name: server.tool_prefix for server in config.servers}
    catalog = [CatalogTool(f"{prefixes[name]}{tool.name}" if counts[tool.name] > 1 else tool.name, name, tool)
               for name, tools in listing.items() for tool in tools]
    exposed = Counter(item.exposed for item in catalog)
    clash = sorted(name for name, n in exposed.items() if n > 1)
    if clash:
        raise ValueError(f"tool names {clash} still collide after prefixing; give the servers distinct prefix values")
    return catalog


def catalog(config: McpConfig) -> list[CatalogTool]:
    """The whole catalogue of ``config`` (cached per config object: the config itself is cached per path)."""
    with _CATALOG_LOCK:
        cached = _CATALOGS.get(id(config))
        if cached is None:
            listing = {server.name: listed_tools(server)[0] for server in config.servers}
            cached = _CATALOGS[id(config)] = build_catalog(listing, config)
        return cached
