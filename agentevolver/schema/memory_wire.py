"""Wire models of the memory service: the ReMe 0.2 task-memory API, as pydantic models.

The service (:mod:`agentevolver.memory_service`) validates requests with these models and the client
(:mod:`agentevolver.client.memory_client`) builds its requests and parses its answers with the same ones, so
the two cannot drift; they live here, under ``schema``, so that the client and the experience manager import
the contract and never the server. The shapes follow ReMe's task memory so that a real ReMe 0.2 server is a
drop-in replacement (change ``base_url``):

* a memory is ``{workspace_id, memory_id, memory_type: "task", when_to_use, content, score, time_created,
  time_modified, author, metadata}``; ``when_to_use`` is what is embedded and searched, ``content`` is the
  experience that is injected into prompts;
* every answer is ``{success, answer, metadata}``; retrieval and summarisation put the memories they
  returned or stored in ``metadata.memory_list``; ``/vector_store`` puts its result in
  ``metadata.action_result``.

Added here, optional, so a client that does not send it gets ReMe's behaviour: ``experience_kind`` on
summary and retrieval requests. ``exemplar`` stores solved episodes whole (no LLM) and retrieves only those,
rendered as worked examples (:mod:`agentevolver.memory_service.exemplar`); ``advice`` (the default) is ReMe's
distilled experience. A stored memory's kind is ``metadata.kind`` (:func:`memory_kind`).

Import-light on purpose (pydantic only): the trainer imports the client without torch or faiss.
"""

from __future__ import annotations

import datetime
import re
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentevolver.schema.error import ErrorDetail
from agentevolver.schema.message import ChatMessage

__all__ = [
    "ACTIONS",
    "ADVICE",
    "EXEMPLAR",
    "WORKSPACE_ID_PATTERN",
    "ErrorAnswer",
    "ErrorDetail",
    "ExperienceKind",
    "ImportMetadata",
    "ImportResponse",
    "InfoMetadata",
    "InfoResponse",
    "MemoryRecordIn",
    "RejectedMemory",
    "RetrieveMetadata",
    "RetrieveRequest",
    "RetrieveResponse",
    "RetrievedMemory",
    "SummaryMetadata",
    "SummaryRequest",
    "SummaryResponse",
    "SummaryStats",
    "TaskMemory",
    "TrajectoryIn",
    "VectorStoreRequest",
    "VectorStoreResponse",
    "WorkspacesMetadata",
    "WorkspacesResponse",
    "memory_kind",
    "now_string",
]

#: Workspace ids name files (``dump`` writes ``<path>/<workspace_id>.jsonl``), so no separators or dot-files.
WORKSPACE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@+=-]{0,199}$"

#: The ``/vector_store`` actions of ReMe 0.2.
ACTIONS = ("copy", "delete", "delete_ids", "dump", "load", "list")
Action = Literal["copy", "delete", "delete_ids", "dump", "load", "list"]

#: The two kinds of experience a workspace can hold (``metadata.kind`` of a memory; advice when absent).
ExperienceKind = Literal["advice", "exemplar"]
ADVICE: ExperienceKind = "advice"
EXEMPLAR: ExperienceKind = "exemplar"

_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def memory_kind(memory: Any) -> ExperienceKind:
    """The kind of a stored memory (a :class:`TaskMemory` or anything with ``metadata``)."""
    metadata = getattr(memory, "metadata", None) or {}
    return EXEMPLAR if metadata.get("kind") == EXEMPLAR else ADVICE


def now_string() -> str:
    """Timestamps as ReMe writes them (local time, seconds)."""
    return datetime.datetime.now().strftime(_TIME_FORMAT)


def _new_id() -> str:
    return uuid.uuid4().hex


def _check_workspace_id(value: str) -> str:
    if not re.match(WORKSPACE_ID_PATTERN, value):
        raise ValueError(
            "must be 1-200 characters of letters, digits and . _ @ + = -, starting with a letter or digit "
            f"(it names files on export); got {value!r}"
        )
    return value


class TaskMemory(BaseModel):
    """One experience, as stored, listed, dumped and returned (ReMe's ``TaskMemory``)."""

    model_config = ConfigDict(extra="ignore")

    workspace_id: str = ""
    memory_id: str = Field(default_factory=_new_id)
    memory_type: Literal["task"] = "task"
    when_to_use: str = Field(description="When this experience applies; the text that is embedded and searched.")
    content: str = Field(description="The experience itself; the text injected into prompts.")
    score: float = Field(default=0.0, description="Quality score (the validation score of the summariser).")
    time_created: str = Field(default_factory=now_string)
    time_modified: str = Field(default_factory=now_string)
    author: str = Field(default="", description="Who wrote it: the summariser's model name, or 'import'.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class RetrievedMemory(TaskMemory):
    """A memory returned by retrieval, with its cosine similarity to the query."""

    similarity: float = 0.0


class MemoryRecordIn(BaseModel):
    """One line of a JSONL import (``/vector_store`` ``load`` or ``POST /workspaces/{id}/import``).

    A ReMe dump line (every :class:`TaskMemory` field) or just ``{"content": ...}`` plus optional
    ``when_to_use`` and ``metadata``: seeding a memory from an existing library needs nothing more. Without
    ``when_to_use`` the content itself is embedded. Vectors are never read from a file: the service embeds
    with its own embedder, so a file moves between machines with different embedders.
    """

    model_config = ConfigDict(extra="ignore")

    memory_id: str | None = Field(default=None, min_length=1, max_length=200)
    memory_type: Literal["task"] = "task"
    when_to_use: str = ""
    content: str = Field(min_length=1)
    score: float = 0.0
    time_created: str | None = None
    time_modified: str | None = None
    author: str = "import"
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_memory(self, workspace_id: str) -> TaskMemory:
        now = now_string()
        return TaskMemory(
            workspace_id=workspace_id,
            memory_id=self.memory_id or _new_id(),
            when_to_use=self.when_to_use.strip() or self.content.strip(),
            content=self.content,
            score=self.score,
            time_created=self.time_created or now,
            time_modified=self.time_modified or now,
            author=self.author,
            metadata=dict(self.metadata),
        )


class TrajectoryIn(BaseModel):
    """One episode sent for summarisation (ReMe's trajectory: ``{messages, score}`` plus optional fields).

    ``task_id`` groups the episodes of one task: failures and successes are compared within a task only.
    Episodes without one form a single group, as ReMe treats one request as one task.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(default="", max_length=500)
    messages: list[ChatMessage] = Field(min_length=1)
    score: float = Field(description="The episode's outcome; >= success_threshold counts as a success.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class SummaryRequest(BaseModel):
    """``POST /summary_task_memory``: distil episodes into experiences of a workspace."""

    model_config = ConfigDict(extra="forbid")

    workspace_id: str = Field(description="The memory's namespace, e.g. one per experiment.")
    trajectories: list[TrajectoryIn] = Field(min_length=1)
    experience_kind: ExperienceKind | None = Field(
        default=None,
        description="advice (default, ReMe's pipeline: the LLM distils experiences) or exemplar (each task's "
        "best solved episode is stored whole as a worked example, no LLM call; unsolved ones are not stored).",
    )

    _workspace = field_validator("workspace_id")(_check_workspace_id)


class RetrieveRequest(BaseModel):
    """``POST /retrieve_task_memory``: the experiences of a workspace most related to a query.

    ``query`` is plain text, or (as the reference trainer sends it) a JSON-encoded list of chat messages,
    in which case the task is read from the last user message. ``messages`` may be sent instead of a query.
    ``top_k`` defaults to the service's ``retrieve.top_k``; the two ``enable_llm_*`` flags override the
    service's defaults for this request.
    """

    model_config = ConfigDict(extra="forbid")

    workspace_id: str = Field(description="The memory's namespace, e.g. one per experiment.")
    query: str = ""
    messages: list[ChatMessage] | None = None
    top_k: int | None = Field(default=None, ge=1)
    enable_llm_rerank: bool | None = None
    enable_llm_rewrite: bool | None = None
    experience_kind: ExperienceKind | None = Field(
        default=None,
        description="Only memories of this kind (exemplar: answered as worked examples, never rewritten); "
        "null = every memory of the workspace, as ReMe.",
    )
    exclude_task_ids: list[str] | None = Field(
        default=None,
        description="Never return a memory whose metadata.task_id is one of these (an episode must not be "
        "shown its own task's solved episode); null = no exclusion, as ReMe.",
    )

    _workspace = field_validator("workspace_id")(_check_workspace_id)


class VectorStoreRequest(BaseModel):
    """``POST /vector_store``: manage a workspace. Which other fields are required depends on ``action``.

    * ``copy``: every memory of ``src_workspace_id`` into ``workspace_id`` (same memory ids; upsert);
    * ``delete``: the whole workspace; ``delete_ids``: the memories named in ``memory_ids``;
    * ``dump``: write ``<path>/<workspace_id>.jsonl`` on the service's machine; ``load``: read that file
      (upsert by ``memory_id``, re-embedding every line);
    * ``list``: every memory of the workspace.
    """

    model_config = ConfigDict(extra="forbid")

    workspace_id: str = Field(description="The memory's namespace, e.g. one per experiment.")
    action: Action
    src_workspace_id: str | None = None
    memory_ids: list[str] | None = None
    path: str | None = None

    _workspace = field_validator("workspace_id")(_check_workspace_id)


class _Response(BaseModel):
    """ReMe's flow response: ``{success, answer, metadata}`` (plus ``error`` when ``success`` is false)."""

    success: bool = True
    answer: str = ""
    error: ErrorDetail | None = None


class RetrieveMetadata(BaseModel):
    memory_list: list[RetrievedMemory] = Field(default_factory=list)
    query: str = Field(default="", description="The text that was embedded (built from query or messages).")
    reranked: bool = False
    rewritten: bool = False
    notes: list[str] = Field(default_factory=list, description="Fallbacks taken, e.g. an unparsable rerank.")


class RetrieveResponse(_Response):
    """``answer`` is the text to inject into a prompt ("" when nothing related is stored)."""

    metadata: RetrieveMetadata = Field(default_factory=RetrieveMetadata)


class RejectedMemory(BaseModel):
    """A candidate experience that was not stored, and why."""

    when_to_use: str
    content: str
    reason: str
    validation_score: float | None = None


class SummaryStats(BaseModel):
    trajectories: int = 0
    tasks: int = 0
    successes: int = 0
    failures: int = 0
    llm_calls: int = 0
    extracted: int = 0
    stored: int = 0
    rejected: int = 0
    duplicates: int = 0
    unparsable_replies: int = 0
    replaced: int = Field(default=0, description="Exemplar mode: stored exemplars replaced by a better one.")


class SummaryMetadata(BaseModel):
    memory_list: list[TaskMemory] = Field(default_factory=list, description="The experiences stored.")
    rejected: list[RejectedMemory] = Field(default_factory=list)
    stats: SummaryStats = Field(default_factory=SummaryStats)


class SummaryResponse(_Response):
    metadata: SummaryMetadata = Field(default_factory=SummaryMetadata)


class VectorStoreMetadata(BaseModel):
    action_result: Any = None


class VectorStoreResponse(_Response):
    metadata: VectorStoreMetadata = Field(default_factory=VectorStoreMetadata)


class ErrorAnswer(BaseModel):
    """Every error answer: ReMe's envelope with ``success: false`` and what to fix (declared in the OpenAPI)."""

    success: Literal[False] = False
    answer: Literal[""] = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: ErrorDetail


class InfoMetadata(BaseModel):
    version: str
    data_dir: str
    store: str
    embedder: str
    dim: int
    summarizer: str | None = Field(description="The summariser's model name; null without an LLM.")
    llm_roles: dict[str, str]
    summary: dict[str, Any]
    retrieve: dict[str, Any]
    query_cache: dict[str, int] = Field(
        description="Query-embedding cache: hits, misses, shared (waited on an embedding already running), size.")


class InfoResponse(BaseModel):
    """``GET /info``: what the service runs with (no ``error`` key on the wire)."""

    success: bool = True
    answer: str = ""
    metadata: InfoMetadata


class WorkspacesMetadata(BaseModel):
    workspaces: dict[str, int] = Field(description="Workspace id -> number of memories, non-empty ones only.")


class WorkspacesResponse(BaseModel):
    """``GET /workspaces``."""

    success: bool = True
    answer: str = ""
    metadata: WorkspacesMetadata


class ImportMetadata(BaseModel):
    imported: int = Field(description="Lines written (upserted by memory_id).")
    size: int = Field(description="Memories in the workspace afterwards.")


class ImportResponse(BaseModel):
    """``POST /workspaces/{workspace_id}/import``."""

    success: bool = True
    answer: str
    metadata: ImportMetadata
