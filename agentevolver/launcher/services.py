"""Companion services as the run's config describes them: the command to start, where to probe health.

A service's address comes from the run's own config (``env_service.env_url``, ``memory.base_url``,
``llm.endpoints.local.base_url``) through the ``url`` key, and the command gets its host and port from
that same URL, so the trainer and the service it talks to cannot disagree about where it listens.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil

from agentevolver.config.schema import ServiceSection
from agentevolver.errors import ConfigError

__all__ = ["ServicePlan", "fill_placeholders", "is_local_host", "plan_service", "port_in_use", "probe"]

#: ``{name}`` fields the launcher fills in a command (``${...}`` is OmegaConf's, resolved before this).
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class ServicePlan:
    """One service, resolved: what to run, where it listens, how to tell it is ready, where it logs."""

    name: str
    argv: tuple[str, ...]
    url: str
    host: str
    port: int
    health_url: str
    ready_timeout_s: float
    env: dict[str, str]
    log_file: str


def fill_placeholders(args: list[str], values: dict[str, str], key: str) -> list[str]:
    """Replace ``{python}``-style fields in ``args``; an unknown field is a config error naming ``key``.

    Only ``{identifier}`` is a field, so JSON or Python snippets in an argument pass through untouched.
    """
    filled = []
    for index, arg in enumerate(args):
        unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(arg)} - set(values))
        if unknown:
            raise ConfigError(
                f"{key}[{index}]: unknown placeholder {{{unknown[0]}}} in {arg!r}; the launcher fills "
                f"{', '.join('{' + v + '}' for v in sorted(values))} (use ${{...}} for config values)"
            )
        filled.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], arg))
    return filled


def plan_service(name: str, spec: ServiceSection, *, envs: str) -> ServicePlan:
    """Resolve ``launcher.services.<name>`` into a :class:`ServicePlan`."""
    key = f"launcher.services.{name}"
    parts = urlsplit(spec.url)
    host = parts.hostname or ""
    try:
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError as err:
        raise ConfigError(f"{key}.url: {err}; got {spec.url!r}") from err
    values = {"python": sys.executable, "host": host, "port": str(port), "envs": envs}
    argv = fill_placeholders(list(spec.command), values, f"{key}.command")
    argv += fill_placeholders(list(spec.extra_args), values, f"{key}.extra_args")
    origin = f"{parts.scheme}://{parts.netloc}"
    return ServicePlan(
        name=name, argv=tuple(argv), url=spec.url, host=host, port=port, health_url=origin + spec.health_path,
        ready_timeout_s=spec.ready_timeout_s, env=dict(spec.env), log_file=spec.log_file or f"{name}.log",
    )


def probe(client: httpx.Client, url: str) -> str | None:
    """``None`` when ``url`` answers 200, else a short reason (for the "not ready" message)."""
    try:
        response = client.get(url)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    if response.status_code == 200:
        return None
    return f"HTTP {response.status_code}"


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts connections on ``host:port`` (a foreign program, if it is not healthy)."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1.0):
        return True
    return False


def is_local_host(host: str) -> bool:
    """Whether ``host`` names this machine (the launcher can only start services here)."""
    if host in {"localhost", "0.0.0.0", "::", "::1"} or host.startswith("127."):
        return True
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    local = {addr.address for addrs in psutil.net_if_addrs().values() for addr in addrs}
    return bool(addresses & local)


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
