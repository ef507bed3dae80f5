"""The memory service without HTTP: embedder + store + LLM clients, and the operations the routes call.

Kept apart from ``app.py`` so the routes stay one screen of wiring and the operations can be read (and
driven by the benchmark) on their own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from agentevolver.client.llm_client import LLMClient, LLMClients
from agentevolver.embedders import Embedder, build_embedder
from agentevolver.memory_service.errors import BadRequest, FileProblem, UnknownWorkspace
from agentevolver.memory_service.jsonl_io import dump_path, parse_jsonl, resolve_io_dir, to_jsonl_lines
from agentevolver.memory_service.retriever import Retriever
from agentevolver.memory_service.settings import MemoryServiceSettings
from agentevolver.memory_service.store import VectorStore, open_store
from agentevolver.memory_service.summarizer import Summarizer
from agentevolver.schema.memory_wire import (
    MemoryRecordIn,
    RetrieveRequest,
    RetrieveResponse,
    SummaryRequest,
    SummaryResponse,
    VectorStoreMetadata,
    VectorStoreRequest,
    VectorStoreResponse,
)

__all__ = ["MemoryService"]

logger = logging.getLogger(__name__)


class MemoryService:
    """Everything behind the routes. Build with :meth:`open` (loads the embedder, opens the store)."""

    def __init__(self, settings: MemoryServiceSettings, embedder: Embedder, store: VectorStore,
                 llm_clients: LLMClients | None) -> None:
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self._llm_clients = llm_clients
        summarizer_llm: LLMClient | None = None
        reranker_llm: LLMClient | None = None
        if llm_clients is not None:
            summarizer_llm = llm_clients.for_role(settings.summarizer_role)
            reranker_llm = llm_clients.for_role(settings.reranker_role)
        self.summarizer = Summarizer(settings.summary, summarizer_llm, embedder, store)
        self.retriever = Retriever(settings.retrieve, reranker_llm, embedder, store)

    @classmethod
    def open(cls, settings: MemoryServiceSettings) -> MemoryService:
        embedder = build_embedder(settings.embedding.backend, settings.embedding, field="embedding.backend")
        store = open_store(settings.store, settings.data_dir, embedder.identity, embedder.dim)
        clients = LLMClients(settings.llm) if settings.llm is not None else None
        return cls(settings, embedder, store, clients)

    async def aclose(self) -> None:
        if self._llm_clients is not None:
            await self._llm_clients.aclose()
        await asyncio.to_thread(self.store.close)

    # ------------------------------------------------------------------ ReMe routes
    async def summarize(self, request: SummaryRequest) -> SummaryResponse:
        return await self.summarizer.summarize(request)

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResponse:
        return await self.retriever.retrieve(request)

    async def vector_store(self, request: VectorStoreRequest) -> VectorStoreResponse:
        result = await getattr(self, f"_action_{request.action}")(request)
        return VectorStoreResponse(answer=f"{request.action} done", metadata=VectorStoreMetadata(action_result=result))

    async def _action_list(self, request: VectorStoreRequest) -> list[dict[str, Any]]:
        memories = await asyncio.to_thread(self.store.list, request.workspace_id)
        return [m.model_dump() for m in memories]

    async def _action_delete(self, request: VectorStoreRequest) -> dict[str, int]:
        return {"deleted": await asyncio.to_thread(self.store.delete_workspace, request.workspace_id)}

    async def _action_delete_ids(self, request: VectorStoreRequest) -> dict[str, int]:
        if not request.memory_ids:
            raise BadRequest("action 'delete_ids' needs memory_ids: a non-empty list of memory ids",
                             field="memory_ids")
        return {"deleted": await asyncio.to_thread(self.store.delete_ids, request.workspace_id, request.memory_ids)}

    async def _action_copy(self, request: VectorStoreRequest) -> dict[str, int]:
        src = request.src_workspace_id
        if not src:
            raise BadRequest("action 'copy' needs src_workspace_id: the workspace to copy from", field="src_workspace_id")
        if await asyncio.to_thread(self.store.count, src) == 0:
            raise UnknownWorkspace(f"src_workspace_id {src!r} holds no memories; nothing to copy",
                                   field="src_workspace_id")
        return {"copied": await asyncio.to_thread(self.store.copy_workspace, src, request.workspace_id)}

    async def _action_dump(self, request: VectorStoreRequest) -> dict[str, Any]:
        folder = resolve_io_dir(request.path, self.settings.io_root)
        target = dump_path(folder, request.workspace_id)
        memories = await asyncio.to_thread(self.store.list, request.workspace_id)

        def write() -> None:
            try:
                folder.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".jsonl.partial")
                with partial.open("w", encoding="utf-8") as out:
                    out.writelines(to_jsonl_lines(memories))
                partial.replace(target)  # a reader never sees half a dump
            except OSError as err:
                raise FileProblem(f"cannot write {target}: {err}", field="path") from err

        await asyncio.to_thread(write)
        return {"size": len(memories), "path": str(target)}

    async def _action_load(self, request: VectorStoreRequest) -> dict[str, Any]:
        source = dump_path(resolve_io_dir(request.path, self.settings.io_root), request.workspace_id)

        def read() -> list[MemoryRecordIn]:
            try:
                with source.open("rb") as lines:
                    return parse_jsonl(lines, source=str(source), field="path")
            except FileNotFoundError as err:
                raise FileProblem(f"{source} does not exist (load reads <path>/<workspace_id>.jsonl)",
                                  field="path") from err
            except OSError as err:
                raise FileProblem(f"cannot read {source}: {err}", field="path") from err

        records = await asyncio.to_thread(read)
        return {"size": await self.import_records(request.workspace_id, records), "path": str(source)}

    # ------------------------------------------------------------------ JSONL over HTTP
    async def import_records(self, workspace_id: str, records: list[MemoryRecordIn]) -> int:
        """Embed and upsert (by memory_id) parsed JSONL records; returns how many were written."""
        if not records:
            return 0
        memories = [record.to_memory(workspace_id) for record in records]
        vectors = await asyncio.to_thread(self.embedder.embed, [m.when_to_use for m in memories])
        return await asyncio.to_thread(self.store.upsert, workspace_id, memories, vectors)

    async def import_jsonl(self, workspace_id: str, lines: Iterable[str | bytes]) -> int:
        return await self.import_records(workspace_id, parse_jsonl(lines, source="request body", field="body"))

    async def export_jsonl(self, workspace_id: str) -> Iterator[str]:
        """The workspace as JSONL lines (read now, in a worker thread; streamed by the caller)."""
        return to_jsonl_lines(await asyncio.to_thread(self.store.list, workspace_id))
