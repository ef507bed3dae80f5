"""The one port helper of the test-suite: every call hands out a distinct port, held until the service binds.

Two ``bind(0)`` calls in a row may return the same port once the first socket is closed (seen in CI: the
launcher refused "memory.url and env.url both use 127.0.0.1:59669"). Here each port stays bound by a
reservation socket, so the kernel cannot give it to anyone else, and a port is never handed out twice in one
test process. The reservation sets ``SO_REUSEADDR`` and never listens, so the real service (uvicorn sets
``SO_REUSEADDR`` too) binds the same port while it is reserved; a test that wants the port really free (a
service that does not set the option) calls :func:`release`.
"""

from __future__ import annotations

import socket
import threading

_LOCK = threading.Lock()
_HANDED_OUT: set[int] = set()
_RESERVED: dict[int, socket.socket] = {}


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that no earlier call returned, reserved until :func:`release` or process exit."""
    with _LOCK:
        while True:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                _RESERVED[port] = sock
                return port
            sock.close()


def release(port: int) -> None:
    """Close the reservation of ``port`` (it is still never handed out again by :func:`free_port`)."""
    with _LOCK:
        sock = _RESERVED.pop(port, None)
    if sock is not None:
        sock.close()


def dead_url(host: str = "127.0.0.1") -> str:
    """The URL of a port nothing listens on (reserved and never listening), for unreachable-service tests."""
    return f"http://{host}:{free_port(host)}"
