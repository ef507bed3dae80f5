"""The routes of the memory service (ReMe's task-memory API plus workspaces), as one router over the app's state.

Each route reaches the opened :class:`~agentevolver.memory_service.service.MemoryService` through a
dependency that reads ``request.app.state``, so the routes are plain module-level functions and
:func:`agentevolver.memory_service.app.create_app` only builds the app and includes this router. Every
route here needs the token; ``/healthz`` is on the app. Request and response models are the client's
(:mod:`agentevolver.schema.memory_wire`): every route but the JSONL export returns its response model, which
FastAPI validates on the way out. ReMe's three routes keep FastAPI's pydantic rendering, as they always
had; the service's own (``/info``, ``/workspaces``, import) keep the ``json.dumps`` rendering they had
before they were typed, so no answer changes by a byte.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from agentevolver import __version__
from agentevolver.memory_service.errors import BadRequest
from agentevolver.memory_service.service import MemoryService
from agentevolver.schema.memory_wire import (
    WORKSPACE_ID_PATTERN,
    ErrorAnswer,
    ImportMetadata,
    ImportResponse,
    InfoMetadata,
    InfoResponse,
    RetrieveRequest,
    RetrieveResponse,
    SummaryRequest,
    SummaryResponse,
    VectorStoreRequest,
    VectorStoreResponse,
    WorkspacesMetadata,
    WorkspacesResponse,
)
from agentevolver.service_common import require_token

__all__ = ["router"]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorAnswer} for status in statuses}


#: Declared errors (the OpenAPI ``responses``): every guarded route may answer 400 (body not JSON), 401
#: (token), 413 (body too large) and 422 (a field); the LLM-backed routes 502 (LLM or embedder failed) and
#: 503 (no LLM configured); vector_store 400 (a dump/load path) and 404 (empty source workspace).
_COMMON = _errors(400, 401, 413, 422)
_LLM = {**_COMMON, **_errors(502, 503)}
_STORE = {**_COMMON, **_errors(404, 502)}


def _service(request: Request) -> MemoryService:
    return request.app.state.service


Service = Annotated[MemoryService, Depends(_service)]

router = APIRouter(dependencies=[Depends(require_token)])


def _check_workspace(workspace_id: str) -> str:
    if not re.match(WORKSPACE_ID_PATTERN, workspace_id):
        raise BadRequest(f"workspace_id {workspace_id!r} must be 1-200 characters of letters, digits and . _ @ + =",
                         field="workspace_id")
    return workspace_id


@router.get("/info", response_class=JSONResponse, responses=_COMMON)
async def info(service: Service) -> InfoResponse:
    settings = service.settings
    llm = settings.llm
    return InfoResponse(metadata=InfoMetadata(
        version=__version__, data_dir=str(settings.data_dir), store=settings.store.backend,
        embedder=service.embedder.identity, dim=service.embedder.dim,
        summarizer=service.summarizer.llm.model if service.summarizer.llm else None,
        llm_roles=dict(llm.roles) if llm else {},
        summary=settings.summary.model_dump(), retrieve=settings.retrieve.model_dump(),
        query_cache={**service.retriever.cache_stats, "size": service.retriever.cache_size}))


@router.post("/retrieve_task_memory", responses=_LLM)
async def retrieve_task_memory(body: RetrieveRequest, service: Service) -> RetrieveResponse:
    return await service.retrieve(body)


@router.post("/summary_task_memory", responses=_LLM)
async def summary_task_memory(body: SummaryRequest, service: Service) -> SummaryResponse:
    return await service.summarize(body)


@router.post("/vector_store", responses=_STORE)
async def vector_store(body: VectorStoreRequest, service: Service) -> VectorStoreResponse:
    return await service.vector_store(body)


@router.get("/workspaces", response_class=JSONResponse, responses=_COMMON)
async def workspaces(service: Service) -> WorkspacesResponse:
    return WorkspacesResponse(metadata=WorkspacesMetadata(workspaces=service.store.workspaces()))


@router.get("/workspaces/{workspace_id}/export", response_class=StreamingResponse, responses={
    200: {"content": {"application/x-ndjson": {"schema": {"type": "string"}}},
          "description": "The workspace as JSONL: one memory (every TaskMemory field) per line."},
    **_COMMON})
async def export_workspace(workspace_id: str, service: Service) -> StreamingResponse:
    lines = await service.export_jsonl(_check_workspace(workspace_id))
    return StreamingResponse(lines, media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="{workspace_id}.jsonl"'})


@router.post("/workspaces/{workspace_id}/import", response_class=JSONResponse, responses=_STORE)
async def import_workspace(workspace_id: str, request: Request, service: Service) -> ImportResponse:
    _check_workspace(workspace_id)
    body = await request.body()
    limit = service.settings.max_body_bytes
    if len(body) > limit:
        raise BadRequest(f"request body exceeds max_body_bytes = {limit}", field="body")
    imported = await service.import_jsonl(workspace_id, body.splitlines())
    return ImportResponse(answer=f"imported {imported} memories",
                          metadata=ImportMetadata(imported=imported, size=service.store.count(workspace_id)))
