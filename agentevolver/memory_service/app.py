"""The HTTP surface of the memory service (FastAPI), wire-compatible with ReMe 0.2's task memory.

ReMe routes: ``POST /retrieve_task_memory``, ``POST /summary_task_memory``, ``POST /vector_store``; all
answer ``{success, answer, metadata}``. Added here: ``GET /healthz`` (``OK`` once the embedder is loaded and
the store open), ``GET /info``, ``GET /workspaces``, and JSONL export/import of one workspace over HTTP
(``GET /workspaces/{id}/export``, ``POST /workspaces/{id}/import``). Request and response models are the
ones the client uses (:mod:`agentevolver.schema.memory_wire`). Every error is JSON ``{success: false, answer: "", metadata: {},
error: {code, message, field}}`` with a status chosen in one place
(:func:`agentevolver.service_common.install_error_handlers`, shared with the environment service); no
traceback ever leaves the service.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from agentevolver import __version__
from agentevolver.memory_service.errors import BadRequest
from agentevolver.memory_service.service import MemoryService
from agentevolver.schema.memory_wire import (
    WORKSPACE_ID_PATTERN,
    ErrorAnswer,
    ImportResponse,
    InfoResponse,
    RetrieveRequest,
    RetrieveResponse,
    SummaryRequest,
    SummaryResponse,
    VectorStoreRequest,
    VectorStoreResponse,
    WorkspacesResponse,
)
from agentevolver.service_common import error_response, install_error_handlers, read_auth_token, require_token

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


#: What an error answer carries besides ``error`` (ReMe's ``{success, answer, metadata}``).
_ERROR_ENVELOPE: dict[str, Any] = {"success": False, "answer": "", "metadata": {}}
#: How the memory service words the validation problems its clients meet most.
_PHRASES = {
    "extra_forbidden": "unknown field {field!r} (see docs/memory_service.md for the fields of this route)",
    "missing": "field {field!r} is required"}


def _error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return error_response(_ERROR_ENVELOPE, status, code, message, field)


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorAnswer} for status in statuses}


#: Declared errors (the OpenAPI ``responses``): every guarded route may answer 400 (body not JSON), 401
#: (token), 413 (body too large) and 422 (a field); the LLM-backed routes 502 (LLM or embedder failed) and
#: 503 (no LLM configured); vector_store 400 (a dump/load path) and 404 (empty source workspace).
_COMMON = _errors(400, 401, 413, 422)
_LLM = {**_COMMON, **_errors(502, 503)}
_STORE = {**_COMMON, **_errors(404, 502)}


def _check_workspace(workspace_id: str) -> str:
    if not re.match(WORKSPACE_ID_PATTERN, workspace_id):
        raise BadRequest(f"workspace_id {workspace_id!r} must be 1-200 characters of letters, digits and . _ @ + =",
                         field="workspace_id")
    return workspace_id


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
    api = APIRouter(dependencies=[Depends(require_token)])  # everything but /healthz needs the token
    install_error_handlers(app, _ERROR_ENVELOPE, service_name="memory service", logger=logger,
                           phrases=_PHRASES, warn_on_5xx=True)

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            return _error_response(413, "body_too_large",
                                   f"request body is {declared} bytes; the limit is {settings.max_body_bytes} "
                                   "(max_body_bytes)", "body")
        return await call_next(request)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "OK"

    @api.get("/info", response_model=None, responses={200: {"model": InfoResponse}, **_COMMON})
    async def info() -> dict[str, Any]:
        llm = settings.llm
        return {"success": True, "answer": "", "metadata": {
            "version": __version__, "data_dir": str(settings.data_dir), "store": settings.store.backend,
            "embedder": service.embedder.identity, "dim": service.embedder.dim,
            "summarizer": service.summarizer.llm.model if service.summarizer.llm else None,
            "llm_roles": dict(llm.roles) if llm else {},
            "summary": settings.summary.model_dump(), "retrieve": settings.retrieve.model_dump(),
            "query_cache": {**service.retriever.cache_stats, "size": service.retriever.cache_size}}}

    @api.post("/retrieve_task_memory", responses=_LLM)
    async def retrieve_task_memory(body: RetrieveRequest) -> RetrieveResponse:
        return await service.retrieve(body)

    @api.post("/summary_task_memory", responses=_LLM)
    async def summary_task_memory(body: SummaryRequest) -> SummaryResponse:
        return await service.summarize(body)

    @api.post("/vector_store", responses=_STORE)
    async def vector_store(body: VectorStoreRequest) -> VectorStoreResponse:
        return await service.vector_store(body)

    @api.get("/workspaces", response_model=None, responses={200: {"model": WorkspacesResponse}, **_COMMON})
    async def workspaces() -> dict[str, Any]:
        return {"success": True, "answer": "", "metadata": {"workspaces": service.store.workspaces()}}

    @api.get("/workspaces/{workspace_id}/export", response_class=StreamingResponse, responses={
        200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}},
              "description": "The workspace as JSONL: one memory (every TaskMemory field) per line."},
        **_COMMON})
    async def export_workspace(workspace_id: str) -> StreamingResponse:
        lines = await service.export_jsonl(_check_workspace(workspace_id))
        return StreamingResponse(lines, media_type="application/x-ndjson",
                                 headers={"Content-Disposition": f'attachment; filename="{workspace_id}.jsonl"'})

    @api.post("/workspaces/{workspace_id}/import", response_model=None,
              responses={200: {"model": ImportResponse}, **_STORE})
    async def import_workspace(workspace_id: str, request: Request) -> dict[str, Any]:
        _check_workspace(workspace_id)
        body = await request.body()
        if len(body) > settings.max_body_bytes:
            raise BadRequest(f"request body exceeds max_body_bytes = {settings.max_body_bytes}", field="body")
        imported = await service.import_jsonl(workspace_id, body.splitlines())
        return {"success": True, "answer": f"imported {imported} memories",
                "metadata": {"imported": imported, "size": service.store.count(workspace_id)}}

    app.include_router(api)
    return app
