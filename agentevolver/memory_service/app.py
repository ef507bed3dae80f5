"""The HTTP surface of the memory service (FastAPI), wire-compatible with ReMe 0.2's task memory.

ReMe routes: ``POST /retrieve_task_memory``, ``POST /summary_task_memory``, ``POST /vector_store``; all
answer ``{success, answer, metadata}``. Added here: ``GET /healthz`` (``OK`` once the embedder is loaded and
the store open), ``GET /info``, ``GET /workspaces``, and JSONL export/import of one workspace over HTTP
(``GET /workspaces/{id}/export``, ``POST /workspaces/{id}/import``). Request and response models are the
ones the client uses (:mod:`agentevolver.schema.memory_wire`). Every error is JSON ``{success: false, answer: "", metadata: {},
error: {code, message, field}}`` with a status chosen in one place
(:func:`agentevolver.service_common.install_error_handlers`, shared with the environment service); no
traceback ever leaves the service.

The routes are one router (:mod:`.routes`) that reaches the service through ``request.app.state``; this
module only builds the app: state, lifespan, error handlers, the body limit and ``/healthz``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from agentevolver import __version__
from agentevolver.memory_service.routes import router
from agentevolver.memory_service.service import MemoryService
from agentevolver.service_common import error_response, install_error_handlers, read_auth_token

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


#: What an error answer carries besides ``error`` (ReMe's ``{success, answer, metadata}``).
_ERROR_ENVELOPE: dict[str, Any] = {"success": False, "answer": "", "metadata": {}}
#: How the memory service words the validation problems its clients meet most.
_PHRASES = {
    "extra_forbidden": "unknown field {field!r} (see docs/memory_service.md for the fields of this route)",
    "missing": "field {field!r} is required"}


def create_app(service: MemoryService) -> FastAPI:
    """Build the app around an opened :class:`MemoryService` (closed when the app shuts down)."""
    settings = service.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        logger.info("memory service ready: data %s, embedder %s, store %s, llm %s", settings.data_dir,
                    service.embedder.identity, settings.store.backend, "on" if settings.llm else "off")
        try:
            yield
        finally:
            await service.aclose()
            logger.info("memory service stopped")

    app = FastAPI(title="AgentEvolver memory service (ReMe task-memory API)", version=__version__, lifespan=lifespan)
    app.state.service = service
    app.state.auth_token = read_auth_token(settings.auth_token_env)
    install_error_handlers(app, _ERROR_ENVELOPE, service_name="memory service", logger=logger,
                           phrases=_PHRASES, warn_on_5xx=True)
    app.middleware("http")(limit_body)
    app.get("/healthz", response_class=PlainTextResponse)(healthz)  # the one route without the token
    app.include_router(router)
    return app


async def healthz() -> str:
    return "OK"


async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """413 for a body whose declared length is over ``max_body_bytes`` (the import route also measures it)."""
    limit = request.app.state.service.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return error_response(_ERROR_ENVELOPE, 413, "body_too_large",
                              f"request body is {declared} bytes; the limit is {limit} (max_body_bytes)", "body")
    return await call_next(request)
