"""The FastAPI app: OpenAI-compatible routes over one :class:`~agentevolver.llm_server.engine.Engine`.

Routes: ``GET /healthz`` (``OK`` once the model is loaded; the app is only served after loading), ``GET
/v1/models``, ``POST /v1/chat/completions`` (with ``response_format`` ``json_object`` / ``json_schema``
enforced by a grammar: :mod:`.structured`), ``POST /v1/completions`` and ``GET /stats`` (the generator's
batch counters, so a caller can see that concurrent requests were decoded together). Every error is
OpenAI's ``{"error": {message, type, param, code}}`` with ``param`` naming the request field to change.

Concurrency: each request awaits the engine, and the generator batches every request pending at that
moment into one decode (see docs/cpu_generator.md), which is what sets this server apart from a server
that runs one ``generate`` at a time. A client that disconnects has its rows dropped from the running
batch at the next step, so retries after a client-side timeout do not pile up work.

The routes are one router (:mod:`.routes`) over the app's :class:`~agentevolver.llm_server.routes.ServerState`;
this module only builds the app: state, lifespan, the error handlers and ``/healthz``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver import __version__
from agentevolver.llm_server.engine import Engine
from agentevolver.llm_server.errors import ServerError, validation_error_to_server_error
from agentevolver.llm_server.routes import ServerState, router
from agentevolver.schema.llm_wire import ChatCompletionRequest, CompletionRequest

__all__ = ["create_app"]

logger = logging.getLogger(__name__)

#: Request model per route, for "did you mean" hints on unknown fields.
_REQUEST_MODELS = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
#: Starlette's own errors (a body that is not UTF-8, an unknown route, a wrong method), in OpenAI's shape.
_HTTP_PARAMS = {400: "body", 404: "path", 405: "method"}


def create_app(
    engine: Engine, *, api_key_env: str | None = None, tool_call_parser: str | None = "hermes"
) -> FastAPI:
    """Build the app around a loaded ``engine``; the engine is closed when the app shuts down.

    Args:
        api_key_env: NAME of an environment variable holding the key clients must send as
            ``Authorization: Bearer <key>`` (every route but ``/healthz``); ``None`` = no key.
        tool_call_parser: registry name of the parser (agentevolver.module.tools.parsing) that turns tool
            calls in a reply into ``message.tool_calls`` when a request carries ``tools``; ``None`` = never.
    """
    state = ServerState(engine=engine, parser=_tool_parser(tool_call_parser), api_key=_api_key(api_key_env),
                        api_key_env=api_key_env)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        logger.info("serving %r (max_model_len %d)", engine.served_name, engine.max_model_len)
        try:
            yield
        finally:
            await engine.aclose()

    app = FastAPI(title="AgentEvolver local LLM server", version=__version__, lifespan=lifespan)
    app.state.engine = engine
    app.state.server = state
    app.exception_handler(ServerError)(on_server_error)
    app.exception_handler(StarletteHTTPException)(on_http_error)
    app.exception_handler(RequestValidationError)(on_invalid)
    app.exception_handler(Exception)(on_unexpected)
    app.get("/healthz", response_class=PlainTextResponse)(healthz)  # the one route without the key
    app.include_router(router)
    return app


async def healthz() -> str:
    return "OK"


# -- errors: every one in OpenAI's shape, counted -------------------------------------------------------------


async def on_server_error(request: Request, err: ServerError) -> JSONResponse:
    request.app.state.server.counters["rejected"] += 400 <= err.status < 499
    return JSONResponse(err.body(), status_code=err.status)


async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    message = ("the body is not valid JSON: send a UTF-8 JSON object" if err.status_code == 400
               else f"{request.method} {request.url.path}: {err.detail} (see /docs for the routes)")
    return await on_server_error(request, ServerError(err.status_code, message,
                                                      param=_HTTP_PARAMS.get(err.status_code)))


async def on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    model = _REQUEST_MODELS.get(request.url.path)
    return await on_server_error(request, validation_error_to_server_error(list(err.errors()), model))


async def on_unexpected(request: Request, err: Exception) -> JSONResponse:
    """A failed batch (``GenerationError``) or a bug: 500 in OpenAI's shape, which clients retry."""
    from agentevolver.backends.cpu import GeneratorClosedError

    if isinstance(err, GeneratorClosedError):
        return await on_server_error(request, ServerError(503, "the server is shutting down", type_="server_error"))
    logger.exception("request to %s failed", request.url.path)
    return await on_server_error(request, ServerError(500, f"generation failed: {type(err).__name__}: {err}",
                                                      type_="server_error"))


# -- start-up helpers -----------------------------------------------------------------------------------------


def _api_key(api_key_env: str | None) -> str | None:
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(f"--api-key-env names {api_key_env!r} but that environment variable is unset or empty; "
                         "export the key in it or leave --api-key-env out")
    return key


def _tool_parser(name: str | None) -> Any:
    if name is None:
        return None
    from agentevolver.module.tools.parsing import get_parser

    return get_parser(name)
