"""Persistent per-workspace vector stores behind one small interface, and a registry of backends.

The service only needs upsert / search / list / delete / copy per workspace, so that is the interface
(:class:`VectorStore`); a server-backed store (Qdrant, Elasticsearch, pgvector) for memories beyond one
machine's RAM is one more class registered with :func:`register_store` and named by ``store.backend``.

The shipped backend, ``faiss`` (:class:`FaissStore`), was the fastest of five libraries measured for this
use (shared/research/offline-models-and-envs.md: exact top-5 of 20k vectors in ~8 ms, recall 1.0):

* SQLite (WAL, ``synchronous=FULL``) in ``data_dir`` is the source of truth: every memory with its vector,
  written in one transaction per request, so a crash or restart loses nothing that was acknowledged;
* one exact inner-product faiss index per workspace (``IndexIDMap2`` over ``IndexFlatIP``, ids = SQLite
  row ids) is a cache built from SQLite on a workspace's first use and kept in step with every write.
  Exact search, because at the sizes one experiment produces (1e3-1e5) it is already fast, needs no
  training, and never misses the one related experience an approximate index could drop;
* a lock file stops a second service process from opening the same folder (its index would go stale).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from filelock import FileLock, Timeout

from agentevolver.memory_service.errors import StoreMismatch
from agentevolver.memory_service.settings import StoreSettings
from agentevolver.registry import Registry
from agentevolver.schema.memory_wire import TaskMemory

__all__ = ["STORES", "FaissStore", "SearchHit", "VectorStore", "open_store", "register_store"]

logger = logging.getLogger(__name__)

_SCHEMA_VERSION = "1"


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One search result: the memory and its cosine similarity to the query (vectors are unit length)."""

    memory: TaskMemory
    similarity: float


class VectorStore(Protocol):
    """Per-workspace storage of memories and their vectors. Implementations are thread-safe."""

    dim: int

    def upsert(self, workspace_id: str, memories: Sequence[TaskMemory], vectors: np.ndarray) -> int:
        """Insert, replacing memories with the same ``memory_id``; returns how many were written."""
        ...

    def search(self, workspace_id: str, vector: np.ndarray, k: int) -> list[SearchHit]:
        """The ``k`` most similar memories, most similar first ([] for an empty/unknown workspace)."""
        ...

    def list(self, workspace_id: str) -> list[TaskMemory]:
        """Every memory of the workspace, oldest first."""
        ...

    def count(self, workspace_id: str) -> int: ...

    def workspaces(self) -> dict[str, int]:
        """Workspace id -> number of memories, for every non-empty workspace."""
        ...

    def delete_ids(self, workspace_id: str, memory_ids: Iterable[str]) -> int: ...

    def delete_workspace(self, workspace_id: str) -> int: ...

    def copy_workspace(self, src_workspace_id: str, dst_workspace_id: str) -> int:
        """Upsert every memory of ``src`` into ``dst`` (same ids, same vectors); returns how many."""
        ...

    def close(self) -> None: ...


StoreFactory = Callable[[Path, str, int, StoreSettings], VectorStore]
#: Vector-store backends by name (``store.backend``).
STORES: Registry[StoreFactory] = Registry("vector store", "store.backend")


def register_store(name: str) -> Callable[[StoreFactory], StoreFactory]:
    """Register a backend ``factory(data_dir, embedder_identity, dim, settings)`` under ``store.backend``'s name.

    A name taken by another backend is an error, so two plugins cannot silently replace each other.
    """
    return STORES.register(name)


def open_store(settings: StoreSettings, data_dir: Path, embedder_identity: str, dim: int) -> VectorStore:
    """Open (creating if needed) the store ``settings.backend`` names."""
    return STORES.get(settings.backend)(data_dir, embedder_identity, dim, settings)


def _record_json(memory: TaskMemory) -> str:
    """The stored form: every field but ``workspace_id`` (the row's column is the one truth, so copy is SQL)."""
    return json.dumps(memory.model_dump(exclude={"workspace_id"}), ensure_ascii=False)


def _to_memory(workspace_id: str, record: str) -> TaskMemory:
    return TaskMemory.model_validate({**json.loads(record), "workspace_id": workspace_id})


@register_store("faiss")
class FaissStore:
    """SQLite as the durable truth + one exact faiss inner-product index per workspace as a search cache."""

    def __init__(self, data_dir: Path, embedder_identity: str, dim: int,
                 settings: StoreSettings | None = None) -> None:
        import faiss  # imported here: the package must import without the memory extra

        faiss.omp_set_num_threads((settings or StoreSettings()).search_threads)  # process-wide, faiss only
        self._faiss = faiss
        self.dim = dim
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Not thread-local (filelock's default): ``MemoryService.aclose`` closes the store in a worker thread,
        # and a thread-local lock released there stays held, so the folder could not be opened again in-process.
        self._file_lock = FileLock(str(self.data_dir / ".lock"), thread_local=False)
        try:
            self._file_lock.acquire(timeout=0)
        except Timeout:
            raise StoreMismatch(
                f"memory data folder {self.data_dir} is in use by another memory service process; stop it or "
                "start this one with another --data-dir"
            ) from None
        try:
            self._db = sqlite3.connect(self.data_dir / "memory.sqlite3", check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._create_schema()
            self._check_meta(embedder_identity, dim)
        except BaseException:
            self._file_lock.release()
            raise
        self._lock = threading.RLock()
        self._indexes: dict[str, object] = {}

    # ------------------------------------------------------------------ set-up
    def _create_schema(self) -> None:
        with self._db:
            self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS memories ("
                " row_id INTEGER PRIMARY KEY AUTOINCREMENT,"
                " workspace_id TEXT NOT NULL,"
                " memory_id TEXT NOT NULL,"
                " record TEXT NOT NULL,"
                " vector BLOB NOT NULL,"
                " UNIQUE (workspace_id, memory_id))"
            )

    def _check_meta(self, identity: str, dim: int) -> None:
        """Record the embedder on first use; refuse a folder whose vectors come from another embedder."""
        meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        if not meta:
            with self._db:
                self._db.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("schema_version", _SCHEMA_VERSION), ("embedder", identity), ("dim", str(dim))],
                )
            return
        if meta.get("schema_version") != _SCHEMA_VERSION:
            raise StoreMismatch(
                f"memory data folder {self.data_dir} has store schema {meta.get('schema_version')!r}; this "
                f"version reads {_SCHEMA_VERSION!r}"
            )
        if meta.get("embedder") != identity or meta.get("dim") != str(dim):
            raise StoreMismatch(
                f"memory data folder {self.data_dir} holds vectors of embedder {meta.get('embedder')!r} "
                f"({meta.get('dim')}-d) but the service is configured with {identity!r} ({dim}-d). Start it "
                "with the same embedding settings, or export each workspace (GET /workspaces/{id}/export) "
                "and import it into a new --data-dir, which re-embeds the texts."
            )

    # ------------------------------------------------------------------ index cache
    def _index(self, workspace_id: str):  # type: ignore[no-untyped-def]  # faiss types are untyped
        """The workspace's faiss index, built from SQLite on first use (caller holds the lock)."""
        index = self._indexes.get(workspace_id)
        if index is None:
            faiss = self._faiss
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(self.dim))
            rows = self._db.execute(
                "SELECT row_id, vector FROM memories WHERE workspace_id = ? ORDER BY row_id", (workspace_id,)
            ).fetchall()
            if rows:
                ids = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
                vectors = np.frombuffer(b"".join(row[1] for row in rows), dtype=np.float32).reshape(-1, self.dim)
                index.add_with_ids(vectors, ids)
            self._indexes[workspace_id] = index
        return index

    # ------------------------------------------------------------------ VectorStore
    def upsert(self, workspace_id: str, memories: Sequence[TaskMemory], vectors: np.ndarray) -> int:
        if len(memories) != len(vectors):
            raise ValueError(f"{len(memories)} memories but {len(vectors)} vectors")
        if not memories:
            return 0
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must be (n, {self.dim}); got {vectors.shape}")
        with self._lock:
            replaced: list[int] = []
            added: list[int] = []
            with self._db:  # one transaction: all of the request or nothing
                for memory, vector in zip(memories, vectors, strict=True):
                    old = self._db.execute(
                        "DELETE FROM memories WHERE workspace_id = ? AND memory_id = ? RETURNING row_id",
                        (workspace_id, memory.memory_id),
                    ).fetchall()
                    replaced.extend(row[0] for row in old)
                    cursor = self._db.execute(
                        "INSERT INTO memories (workspace_id, memory_id, record, vector) VALUES (?, ?, ?, ?)",
                        (workspace_id, memory.memory_id, _record_json(memory), vector.tobytes()),
                    )
                    added.append(int(cursor.lastrowid or 0))
            index = self._indexes.get(workspace_id)
            if index is not None:  # keep a loaded cache in step; an unloaded one is built from SQLite later
                if replaced:
                    index.remove_ids(np.asarray(replaced, dtype=np.int64))
                index.add_with_ids(vectors, np.asarray(added, dtype=np.int64))
        return len(memories)

    def search(self, workspace_id: str, vector: np.ndarray, k: int) -> list[SearchHit]:
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, self.dim)
        with self._lock:
            index = self._index(workspace_id)
            if index.ntotal == 0 or k <= 0:
                return []
            scores, ids = index.search(query, min(k, index.ntotal))
            found = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
            if not found:
                return []
            marks = ",".join("?" * len(found))
            rows = dict(
                self._db.execute(
                    f"SELECT row_id, record FROM memories WHERE row_id IN ({marks})", [i for i, _ in found]
                ).fetchall()
            )
        return [SearchHit(_to_memory(workspace_id, rows[i]), s) for i, s in found if i in rows]

    def list(self, workspace_id: str) -> list[TaskMemory]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM memories WHERE workspace_id = ? ORDER BY row_id", (workspace_id,)
            ).fetchall()
        return [_to_memory(workspace_id, row[0]) for row in rows]

    def count(self, workspace_id: str) -> int:
        with self._lock:
            return int(
                self._db.execute("SELECT COUNT(*) FROM memories WHERE workspace_id = ?", (workspace_id,)).fetchone()[0]
            )

    def workspaces(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT workspace_id, COUNT(*) FROM memories GROUP BY workspace_id ORDER BY workspace_id"
            ).fetchall()
        return {row[0]: int(row[1]) for row in rows}

    def delete_ids(self, workspace_id: str, memory_ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(memory_ids))
        if not ids:
            return 0
        with self._lock:
            removed: list[int] = []
            with self._db:
                for memory_id in ids:
                    rows = self._db.execute(
                        "DELETE FROM memories WHERE workspace_id = ? AND memory_id = ? RETURNING row_id",
                        (workspace_id, memory_id),
                    ).fetchall()
                    removed.extend(row[0] for row in rows)
            index = self._indexes.get(workspace_id)
            if index is not None and removed:
                index.remove_ids(np.asarray(removed, dtype=np.int64))
        return len(removed)

    def delete_workspace(self, workspace_id: str) -> int:
        with self._lock:
            with self._db:
                cursor = self._db.execute("DELETE FROM memories WHERE workspace_id = ?", (workspace_id,))
            self._indexes.pop(workspace_id, None)
            return int(cursor.rowcount)

    def copy_workspace(self, src_workspace_id: str, dst_workspace_id: str) -> int:
        if src_workspace_id == dst_workspace_id:
            return self.count(src_workspace_id)
        with self._lock:
            with self._db:
                cursor = self._db.execute(
                    "INSERT OR REPLACE INTO memories (workspace_id, memory_id, record, vector) "
                    "SELECT ?, memory_id, record, vector FROM memories WHERE workspace_id = ? ORDER BY row_id",
                    (dst_workspace_id, src_workspace_id),
                )
            self._indexes.pop(dst_workspace_id, None)  # rebuilt from SQLite on next use
            return int(cursor.rowcount)

    def close(self) -> None:
        with self._lock:
            self._indexes.clear()
            self._db.close()
        self._file_lock.release()
