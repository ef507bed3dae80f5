"""The rollout request router as a process that does not import verl (``trainer.request_router: light``).

verl routes every generation request through one Ray actor, its ``GlobalRequestLoadBalancer``: a request keeps
the server its earlier turns used (the server's prefix cache holds them), and a new one goes to a server with the
fewest requests in flight. The actor's class lives in a verl module, so its process imports verl, torch and
transformers to count requests: about 9 CPU seconds and 0.6 GB per run (bench/startup_profile.py's CPU table).
:class:`StickyLeastLoadedRouter` routes the same way and imports nothing but the standard library; verl loads it
through its own seam, ``rollout.router_config_path`` (a YAML naming ``router_class``: :data:`ROUTER_YAML`), and
calls it through the same methods. ``agentevolver.main_ppo`` points that key here unless the run names a router
of its own or asks for ``rollout.full_determinism`` (verl's balancer routes by a hash of the request id then).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["ROUTER_YAML", "StickyLeastLoadedRouter"]

#: verl's ``actor_rollout_ref.rollout.router_config_path`` for this router (shipped with the package).
ROUTER_YAML = Path(__file__).with_name("router.yaml")


class StickyLeastLoadedRouter:
    """verl's routing contract (``verl.workers.rollout.router.RequestLoadBalancer``) kept in plain dictionaries.

    Args:
        servers: ``{server address: server actor handle}``, from verl's server manager.
        config: the router YAML as a dict; ``max_sticky`` caps the remembered request ids (oldest dropped first).
    """

    def __init__(self, servers: dict[str, Any], config: dict[str, Any] | None = None) -> None:
        self._servers: dict[str, Any] = dict(servers)
        self._inflight: dict[str, int] = dict.fromkeys(servers, 0)
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._max_sticky = int((config or {}).get("max_sticky", 10000))
        self._random = random.Random()

    def require_acquire_fields(self) -> list[str]:
        """Routing reads the request id only, so no other field of ``generate()`` is sent here."""
        return []

    def require_release_fields(self) -> list[str]:
        """Releasing reads the server id only."""
        return []

    def acquire_server(self, request_id: str, **_fields: Any) -> tuple[str, Any]:
        """The server for ``request_id``: the one its earlier turns used while it is registered, else one of
        those with the fewest requests in flight (chosen at random among equals). Counts it in flight."""
        server_id = self._sticky.get(request_id)
        if server_id in self._servers:
            self._sticky.move_to_end(request_id)
        else:
            if not self._servers:
                raise RuntimeError("the rollout request router has no server registered")
            fewest = min(self._inflight.values())
            server_id = self._random.choice([sid for sid, count in self._inflight.items() if count == fewest])
            self._sticky[request_id] = server_id
            while len(self._sticky) > self._max_sticky:
                self._sticky.popitem(last=False)
        self._inflight[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        """One request of ``server_id`` finished (a server removed meanwhile is ignored)."""
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def add_servers(self, servers: dict[str, Any]) -> None:
        """Register servers (verl's elastic and fully-async trainers add replicas at run time)."""
        for server_id, handle in servers.items():
            self._servers[server_id] = handle
            self._inflight.setdefault(server_id, 0)

    def remove_servers(self, server_ids: list[str]) -> None:
        """Unregister servers; requests stuck to them are routed anew on their next turn."""
        for server_id in server_ids:
            self._servers.pop(server_id, None)
            self._inflight.pop(server_id, None)

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Forget every request's server (verl calls it after adding replicas), in verl's reply shape."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict[str, Any]:
        """In-flight counts per server, in verl's reply shape."""
        return {"servers": dict(self._inflight), "total_inflight": self.get_total_inflight(),
                "active_servers": len(self._inflight), "registered_handles": list(self._servers)}
