"""The viewer's web app: server-rendered pages over a folder of runs (see docs/logview.md).

Pages: ``/`` runs, ``/run`` steps and metric curves, ``/step`` the episodes of one step (filters, sort),
``/episode`` one episode (conversation and token view); ``/api/run`` lets the run page notice new steps
of a run that is still writing; ``/healthz`` answers the launcher. Every problem a user can meet (root
not there yet, missing step, corrupt line, wrong field type, bad query parameter) renders as a page that
says what is wrong; nothing in the files can crash the server. A client that sends ``Accept:
application/json`` (and every ``/api/*`` caller) gets the same errors as JSON ``{"error": {code, message,
field, hint}}`` naming the query parameter to change; every route declares its answers in ``/openapi.json``.

The routes are one router (:mod:`.routes`) over the app's :class:`~agentevolver.logview.viewer.Viewer`; this
module only builds the app: the viewer, the tokenizer preload and the error handlers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentevolver.logview.routes import router
from agentevolver.logview.runs import ViewerError
from agentevolver.logview.tokens import TokenDecoder
from agentevolver.logview.viewer import Viewer, viewer_of

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def create_app(root: str | Path, *, tokenizer: str | None = None, max_depth: int = 4) -> FastAPI:
    """The viewer over ``root`` (a run folder or a folder of runs; it may not exist yet)."""
    viewer = Viewer(Path(root).expanduser().resolve(), max_depth, TokenDecoder(tokenizer))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        threading.Thread(target=viewer.decoder.preload, name="logview-tokenizer", daemon=True).start()
        yield

    app = FastAPI(title="AgentEvolver trajectory viewer", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.viewer = viewer
    app.exception_handler(ViewerError)(viewer_error)
    app.exception_handler(RequestValidationError)(bad_parameter)
    app.exception_handler(StarletteHTTPException)(http_error)
    app.exception_handler(Exception)(unexpected)
    app.include_router(router)
    return app


async def viewer_error(request: Request, err: ViewerError) -> Response:
    return viewer_of(request).error(request, err.status, "not_found" if err.status == 404 else "viewer_error",
                                  err.message, err.hint, err.field)


async def bad_parameter(request: Request, err: RequestValidationError) -> Response:
    problems = err.errors()
    lines = [f"query parameter {'.'.join(str(p) for p in e['loc'][1:])!r}: {e['msg']}" for e in problems]
    field = ".".join(str(p) for p in problems[0]["loc"][1:]) if problems else None
    return viewer_of(request).error(request, 422, "invalid_parameter", "; ".join(lines),
                                  "use the links and forms of the pages instead of editing the address", field)


async def http_error(request: Request, err: StarletteHTTPException) -> Response:
    field = {404: "path", 405: "method"}.get(err.status_code)
    return viewer_of(request).error(request, err.status_code, f"http_{err.status_code}",
                                  f"{request.url.path}: {err.detail}", None, field)


async def unexpected(request: Request, err: Exception) -> Response:
    logger.exception("viewer error on %s", request.url)
    return viewer_of(request).error(request, 500, "internal_error", f"the viewer failed: {type(err).__name__}: {err}",
                                  "this is a bug in the viewer; the server log has the details", None)
