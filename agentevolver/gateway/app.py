"""The gateway's FastAPI app, and the server that runs it inside the process that runs the episodes.

Why in that process, on its event loop: the gateway generates through the run's rollout servers with
verl's server manager, an object that lives in the agent-loop worker (a Ray actor whose async methods share
one event loop). Served there, a call from an agent program goes HTTP -> this app -> ``generate`` with no
other hop, and the episodes' token records stay next to the agent loop that turns them into training rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver import __version__
from agentevolver.gateway.episodes import Gateway
from agentevolver.gateway.routes import router
from agentevolver.llm_server.errors import ServerError, validation_error_to_server_error
from agentevolver.schema.gateway_wire import GatewayChatRequest
from agentevolver.schema.responses_wire import ResponsesRequest

__all__ = ["GatewayServer", "create_app"]

logger = logging.getLogger(__name__)


def create_app(gateway: Gateway) -> FastAPI:
    """The app over ``gateway`` (routes: :mod:`.routes`; ``GET /healthz``)."""
    app = FastAPI(title="AgentEvolver agent gateway", version=__version__)
    app.state.gateway = gateway
    app.exception_handler(ServerError)(_on_server_error)
    app.exception_handler(StarletteHTTPException)(_on_http_error)
    app.exception_handler(RequestValidationError)(_on_invalid)
    app.get("/healthz", response_class=PlainTextResponse)(_healthz)
    app.include_router(router)
    return app


async def _healthz() -> str:
    return "OK"


async def _on_server_error(_: Request, err: ServerError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


async def _on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    message = ("the body is not valid JSON: send a UTF-8 JSON object" if err.status_code == 400
               else f"{request.method} {request.url.path}: {err.detail} (the routes are "
                    "/episodes/<id>/v1/chat/completions, /episodes/<id>/v1/responses, /episodes/<id>/v1/models, "
                    "/episodes/<id>/reward)")
    return await _on_server_error(request, ServerError(err.status_code, message))


async def _on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    path = request.url.path
    model = (GatewayChatRequest if path.endswith("/chat/completions")
             else ResponsesRequest if path.endswith("/responses") else None)
    return await _on_server_error(request, validation_error_to_server_error(list(err.errors()), model))


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the host process (a Ray worker, a test) owns its signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class GatewayServer:
    """Serves a gateway's app on the running event loop (see the module docstring).

    ``port`` 0 takes a free port; :attr:`url` (the programs' base) is known once :meth:`start` returned.
    """

    def __init__(self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        self.host = host
        self.port = port
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        if self._server is None or not self._server.started:
            raise RuntimeError("the gateway is not serving yet: await start() first")
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve; returns once requests are answered. The socket is bound here, not by uvicorn,
        whose failed bind ends the process (``sys.exit``) - the host process must get an error instead."""
        try:
            sock = socket.create_server((self.host, self.port))
        except OSError as err:
            raise OSError(f"agent_program: the gateway cannot listen on {self.host}:{self.port} ({err}); set "
                          "agent_program.port to 0 for a free port") from err
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.gateway), log_level="warning", lifespan="off", access_log=False)
        self._server = _EmbeddedServer(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the gateway server stopped before it started")
            await asyncio.sleep(0.01)
        logger.info("agent gateway serving at %s", self.url)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
