"""The one client of the experience memory service (ours or a real ReMe 0.2 server), sync and async.

Requests are built and answers parsed with the service's own wire models
(:mod:`agentevolver.schema.memory_wire`), so client and server cannot drift. Failure policy, chosen per
route by what a retry can break:

* every route retries connection failures, 429 and 503 (the request was not processed), with full-jitter
  exponential backoff (:class:`~agentevolver.client.retry.FullJitterBackoff`, shared with the other clients);
* idempotent routes also retry timeouts, 500, 502 and 504: retrieval, listing, export, and the
  ``/vector_store`` actions (load upserts by memory id, so a repeat writes the same rows);
* summarisation and JSONL import are not retried after the request may have been processed (a repeat
  could store an experience twice);
* everything else raises :class:`MemoryClientError` carrying the service's error code and field, whose
  message leads with the service's own words and the field it names (``memory service rejected
  /retrieve_task_memory: top_k: ...``; FastAPI's default ``detail`` bodies of a real ReMe server too).

Each operation with a sync and an async form is written once, as a :data:`~agentevolver.client.http.Flow`;
the two methods are one-line facades over it. The plumbing (pools, auth header, the retry loop, the drivers,
answer parsing) is :class:`~agentevolver.client.http.ServiceClient`, shared with the environment client; this
module holds the memory routes and their failure policy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from agentevolver.client.http import Call, Flow, ServiceClient, ServiceClientError
from agentevolver.schema.memory_wire import (
    ExperienceKind,
    ImportResponse,
    RetrieveRequest,
    RetrieveResponse,
    SummaryRequest,
    SummaryResponse,
    TaskMemory,
    TrajectoryIn,
    VectorStoreRequest,
    VectorStoreResponse,
    WorkspacesResponse,
)

__all__ = ["MemoryClient", "MemoryClientError", "MemoryClientSettings"]

logger = logging.getLogger(__name__)

_RETRY_IF_IDEMPOTENT = frozenset({500, 502, 504})


class MemoryClientError(ServiceClientError):
    """A memory service request failed for good; ``status``/``code``/``field`` come from the service."""


@dataclass(frozen=True)
class MemoryClientSettings:
    """Where the service is and how patient to be. ``timeout_s`` is long: a summary waits on LLM calls."""

    base_url: str
    timeout_s: float = 600.0
    max_retries: int = 3
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    auth_token_env: str | None = None

    @classmethod
    def from_config(cls, section: Any) -> MemoryClientSettings:
        """From the trainer's ``memory`` section (``base_url``; other fields when the section has them)."""
        get = section.get if isinstance(section, Mapping) else lambda key, default=None: getattr(section, key, default)
        values = {name: get(name, None) for name in ("timeout_s", "max_retries", "backoff_initial_s",
                                                     "backoff_max_s", "auth_token_env")}
        return cls(base_url=get("base_url"), **{k: v for k, v in values.items() if v is not None})


class MemoryClient(ServiceClient):
    """Talk to one memory service. Thread-safe; usable from any number of event loops."""

    service_name: ClassVar[str] = "memory service"
    error_type: ClassVar[type[ServiceClientError]] = MemoryClientError
    log: ClassVar[logging.Logger] = logger
    not_retried_note: ClassVar[str] = " (not retried: the service may have processed it)"
    settings: MemoryClientSettings

    def __init__(self, settings: MemoryClientSettings | str) -> None:
        if isinstance(settings, str):
            settings = MemoryClientSettings(base_url=settings)
        super().__init__(settings, settings.base_url.rstrip("/"), max_connections=64,
                         max_keepalive_connections=16)

    @classmethod
    def from_config(cls, section: Any) -> MemoryClient:
        return cls(MemoryClientSettings.from_config(section))

    # ------------------------------------------------------------------ request core
    def _accept(self, where: str, response: httpx.Response, idempotent: bool) -> httpx.Response:
        """Any 200 (routes differ in what they answer); any other answer raises :meth:`_refusal`'s error."""
        if response.status_code == 200:
            return response
        raise self._refusal(where, response, idempotent)

    def _repeatable(self, status: int, code: str | None) -> bool:
        """500, 502 and 504 on an idempotent route (429 and 503 are retried everywhere)."""
        return status in _RETRY_IF_IDEMPOTENT

    # ------------------------------------------------------------------ request builders
    @staticmethod
    def _summary_body(workspace_id: str, trajectories: Sequence[TrajectoryIn | Mapping[str, Any]],
                      experience_kind: ExperienceKind | None = None) -> dict[str, Any]:
        """Validated here first, so a malformed episode fails in the caller, naming the field. The optional
        ``experience_kind`` is sent only when given, so a real ReMe server sees its own request shape."""
        request = SummaryRequest(workspace_id=workspace_id, experience_kind=experience_kind, trajectories=[
            t if isinstance(t, TrajectoryIn) else TrajectoryIn.model_validate(t) for t in trajectories])
        body: dict[str, Any] = {
            "workspace_id": request.workspace_id,
            "trajectories": [t.model_dump(mode="json", exclude_none=True) for t in request.trajectories]}
        if request.experience_kind is not None:
            body["experience_kind"] = request.experience_kind
        return body

    @staticmethod
    def _retrieve_body(workspace_id: str, query: str, top_k: int | None,
                       **flags: bool | str | list[str] | None) -> dict[str, Any]:
        request = RetrieveRequest(workspace_id=workspace_id, query=query, top_k=top_k, **flags)
        return request.model_dump(mode="json", exclude_none=True)

    # ------------------------------------------------------------------ operations with a sync and an async form
    def _summary(self, workspace_id: str, trajectories: Sequence[TrajectoryIn | Mapping[str, Any]],
                 experience_kind: ExperienceKind | None) -> Flow[SummaryResponse]:
        body = self._summary_body(workspace_id, trajectories, experience_kind)
        return self._answer(Call("POST", "/summary_task_memory", idempotent=False, options={"json": body}),
                            SummaryResponse)

    def _retrieve(self, workspace_id: str, query: str, top_k: int | None, enable_llm_rerank: bool | None,
                  enable_llm_rewrite: bool | None, experience_kind: ExperienceKind | None,
                  exclude_task_ids: Sequence[str] | None) -> Flow[RetrieveResponse]:
        body = self._retrieve_body(workspace_id, query, top_k, enable_llm_rerank=enable_llm_rerank,
                                   enable_llm_rewrite=enable_llm_rewrite, experience_kind=experience_kind,
                                   exclude_task_ids=list(exclude_task_ids) if exclude_task_ids else None)
        return self._answer(Call("POST", "/retrieve_task_memory", idempotent=True, options={"json": body}),
                            RetrieveResponse)

    def _vector_store(self, request: VectorStoreRequest) -> Flow[VectorStoreResponse]:
        body = request.model_dump(mode="json", exclude_none=True)
        return self._answer(Call("POST", "/vector_store", idempotent=True, options={"json": body}),
                            VectorStoreResponse)

    # ------------------------------------------------------------------ sync API
    def summary(self, workspace_id: str, trajectories: Sequence[TrajectoryIn | Mapping[str, Any]], *,
                experience_kind: ExperienceKind | None = None) -> SummaryResponse:
        """Distil episodes (``{messages, score, task_id?}``) into experiences stored in the workspace;
        ``experience_kind="exemplar"`` stores each task's best solved episode whole instead (no LLM)."""
        return self._run(self._summary(workspace_id, trajectories, experience_kind))

    def retrieve(self, workspace_id: str, query: str, top_k: int | None = None, *,
                 enable_llm_rerank: bool | None = None, enable_llm_rewrite: bool | None = None,
                 experience_kind: ExperienceKind | None = None,
                 exclude_task_ids: Sequence[str] | None = None) -> RetrieveResponse:
        """The workspace's experiences most related to ``query`` (only those of ``experience_kind`` when
        given, none of the tasks in ``exclude_task_ids``); ``.answer`` is the text to inject."""
        return self._run(self._retrieve(workspace_id, query, top_k, enable_llm_rerank, enable_llm_rewrite,
                                        experience_kind, exclude_task_ids))

    def vector_store(self, request: VectorStoreRequest) -> VectorStoreResponse:
        """Any ``/vector_store`` action (the helpers below cover each one)."""
        return self._run(self._vector_store(request))

    def list_memories(self, workspace_id: str) -> list[TaskMemory]:
        result = self.vector_store(VectorStoreRequest(workspace_id=workspace_id, action="list"))
        return [TaskMemory.model_validate(item) for item in result.metadata.action_result or []]

    def delete_workspace(self, workspace_id: str) -> Any:
        return self.vector_store(VectorStoreRequest(workspace_id=workspace_id, action="delete")).metadata.action_result

    def delete_ids(self, workspace_id: str, memory_ids: Iterable[str]) -> Any:
        request = VectorStoreRequest(workspace_id=workspace_id, action="delete_ids", memory_ids=list(memory_ids))
        return self.vector_store(request).metadata.action_result

    def copy_workspace(self, src_workspace_id: str, dst_workspace_id: str) -> Any:
        request = VectorStoreRequest(workspace_id=dst_workspace_id, action="copy", src_workspace_id=src_workspace_id)
        return self.vector_store(request).metadata.action_result

    def dump(self, workspace_id: str, path: str | Path) -> Any:
        """Write ``<path>/<workspace_id>.jsonl`` on the SERVICE's machine."""
        request = VectorStoreRequest(workspace_id=workspace_id, action="dump", path=str(path))
        return self.vector_store(request).metadata.action_result

    def load(self, workspace_id: str, path: str | Path) -> Any:
        """Read ``<path>/<workspace_id>.jsonl`` on the SERVICE's machine into the workspace."""
        request = VectorStoreRequest(workspace_id=workspace_id, action="load", path=str(path))
        return self.vector_store(request).metadata.action_result

    def workspaces(self) -> dict[str, int]:
        """Workspace id -> number of memories (this service's extension; ReMe has no such route)."""
        answer = self._run(self._answer(Call("GET", "/workspaces", idempotent=True), WorkspacesResponse))
        return dict(answer.metadata.workspaces)

    def export_jsonl(self, workspace_id: str, path: str | Path) -> int:
        """Download the workspace as JSONL into ``path`` on THIS machine; returns the number of memories."""
        response = self._send("GET", f"/workspaces/{workspace_id}/export", idempotent=True)
        lines = [line for line in response.text.splitlines() if line.strip()]
        Path(path).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        return len(lines)

    def import_jsonl(self, workspace_id: str, path: str | Path) -> int:
        """Upload a JSONL file from THIS machine into the workspace (re-embedded there); returns the count."""
        call = Call("POST", f"/workspaces/{workspace_id}/import", idempotent=False, options={
            "content": Path(path).read_bytes(), "headers": {"Content-Type": "application/x-ndjson"}})
        return self._run(self._answer(call, ImportResponse)).metadata.imported

    # ------------------------------------------------------------------ async API (what the trainer's rollout uses)
    async def asummary(self, workspace_id: str, trajectories: Sequence[TrajectoryIn | Mapping[str, Any]], *,
                       experience_kind: ExperienceKind | None = None) -> SummaryResponse:
        """Async :meth:`summary`."""
        return await self._arun(self._summary(workspace_id, trajectories, experience_kind))

    async def aretrieve(self, workspace_id: str, query: str, top_k: int | None = None, *,
                        enable_llm_rerank: bool | None = None,
                        enable_llm_rewrite: bool | None = None,
                        experience_kind: ExperienceKind | None = None,
                        exclude_task_ids: Sequence[str] | None = None) -> RetrieveResponse:
        """Async :meth:`retrieve`."""
        return await self._arun(self._retrieve(workspace_id, query, top_k, enable_llm_rerank, enable_llm_rewrite,
                                               experience_kind, exclude_task_ids))

    async def avector_store(self, request: VectorStoreRequest) -> VectorStoreResponse:
        """Async :meth:`vector_store`."""
        return await self._arun(self._vector_store(request))
