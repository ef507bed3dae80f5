"""Retrieval: a query in, the related experiences of a workspace out, as records and as prompt text.

ReMe's retrieve pipeline: build the query -> embed it -> exact vector recall of the top-k (top-k x
``recall_multiplier`` when an LLM reranks) -> optional LLM rerank -> optional LLM rewrite of the selection
into advice for this query; otherwise the experiences are formatted as numbered blocks. A workspace that
holds nothing answers ``""``: a fresh run retrieves before its first summary, and that is not an error.

A request with ``experience_kind`` recalls only memories of that kind (the recall widens until it has
``top_k`` of them or has seen the whole workspace). Exemplars are answered as their worked examples, most
similar first, with no numbered header and never rewritten (a rewrite would destroy the form that makes
them useful; :mod:`.exemplar`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict

import numpy as np

from agentevolver.client.llm_client import LLMClient
from agentevolver.embedders import Embedder
from agentevolver.errors import LLMError
from agentevolver.memory_service import prompts
from agentevolver.memory_service.errors import BadRequest, LLMFailed, LLMNotConfigured
from agentevolver.memory_service.exemplar import format_exemplars
from agentevolver.memory_service.settings import RetrieveSettings
from agentevolver.memory_service.store import SearchHit, VectorStore
from agentevolver.schema.memory_wire import (
    EXEMPLAR,
    ExperienceKind,
    RetrievedMemory,
    RetrieveMetadata,
    RetrieveRequest,
    RetrieveResponse,
    memory_kind,
)
from agentevolver.schema.message import ChatMessage

__all__ = ["Retriever", "build_query"]

logger = logging.getLogger(__name__)


def _messages_in(text: str) -> list[ChatMessage] | None:
    """The chat messages a query holds when it is a JSON-encoded message list (the reference trainer's form)."""
    if not text.lstrip().startswith("["):
        return None
    try:
        value = json.loads(text)
        return [ChatMessage.model_validate(item) for item in value] if isinstance(value, list) and value else None
    except ValueError:  # not JSON, or not messages: a plain query that happens to start with "["
        return None


def build_query(request: RetrieveRequest) -> str:
    """The text to embed: the query, or the task (last user message) of the messages sent or encoded in it."""
    messages = request.messages or _messages_in(request.query)
    if messages:
        for message in reversed(messages):
            if message.role == "user" and message.content.strip():
                return message.content.strip()
        raise BadRequest("the messages hold no user message with content to search with",
                         field="messages" if request.messages else "query")
    if not request.query.strip():
        raise BadRequest("send a non-empty query (the task to find experience for) or messages", field="query")
    return request.query.strip()


class Retriever:
    """Answers :class:`RetrieveRequest`; one per service, safe for concurrent requests."""

    def __init__(self, settings: RetrieveSettings, llm: LLMClient | None, embedder: Embedder,
                 store: VectorStore) -> None:
        self.settings = settings
        self.llm = llm
        self.embedder = embedder
        self.store = store
        # Query text -> its embedding. Touched only on the event loop, so no lock. ``_embedding`` holds the
        # embeddings being computed: the episodes of a group ask at the same moment and share one.
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._embedding: dict[str, asyncio.Future[np.ndarray]] = {}  # query -> embed([query]) task
        self.cache_stats = {"hits": 0, "misses": 0, "shared": 0}

    @property
    def cache_size(self) -> int:
        """Query embeddings held now."""
        return len(self._cache)

    async def embed_query(self, query: str) -> np.ndarray:
        """The query's embedding: from the cache, from a computation already running, or computed now.

        The computation is a task of its own, so a requester that goes away (client disconnect) does not
        cancel it for the others waiting on it.
        """
        size = self.settings.query_cache_size
        cached = self._cache.get(query) if size else None
        if cached is not None:
            self._cache.move_to_end(query)
            self.cache_stats["hits"] += 1
            return cached
        running = self._embedding.get(query)
        if running is None:
            self.cache_stats["misses"] += 1
            running = asyncio.ensure_future(asyncio.to_thread(self.embedder.embed, [query]))
            self._embedding[query] = running
            running.add_done_callback(lambda done: self._embedded(query, done))
        else:
            self.cache_stats["shared"] += 1
        return (await asyncio.shield(running))[0]

    def _embedded(self, query: str, done: asyncio.Future[np.ndarray]) -> None:
        self._embedding.pop(query, None)
        if done.cancelled() or done.exception() is not None or not self.settings.query_cache_size:
            return  # a failure is raised to every waiter and not cached: the next request tries again
        self._cache[query] = done.result()[0]
        while len(self._cache) > self.settings.query_cache_size:
            self._cache.popitem(last=False)

    async def retrieve(self, request: RetrieveRequest) -> RetrieveResponse:
        s = self.settings
        top_k = request.top_k or s.top_k
        if top_k > s.max_top_k:
            raise BadRequest(f"top_k must be <= {s.max_top_k} (this service's retrieve.max_top_k); got {top_k}",
                             field="top_k")
        rerank = s.enable_llm_rerank if request.enable_llm_rerank is None else request.enable_llm_rerank
        rewrite = s.enable_llm_rewrite if request.enable_llm_rewrite is None else request.enable_llm_rewrite
        for flag, wanted in (("enable_llm_rerank", rerank), ("enable_llm_rewrite", rewrite)):
            if wanted and self.llm is None:
                raise LLMNotConfigured(f"{flag} needs an LLM, and this memory service was started without one",
                                       field=flag)
        query = build_query(request)
        meta = RetrieveMetadata(query=query)

        vector = await self.embed_query(query)
        recall = top_k * s.recall_multiplier if rerank else top_k
        hits = await self._search(request.workspace_id, vector, recall, request.experience_kind,
                                  frozenset(request.exclude_task_ids or ()))
        if s.min_similarity is not None:
            hits = [h for h in hits if h.similarity >= s.min_similarity]
        if rerank and len(hits) > 1:
            hits = await self._rerank(query, hits, meta)
        hits = hits[:top_k]
        meta.memory_list = [RetrievedMemory(**h.memory.model_dump(), similarity=h.similarity) for h in hits]

        if request.experience_kind == EXEMPLAR:
            if rewrite:
                meta.notes.append("exemplars are never rewritten; enable_llm_rewrite was ignored")
            return RetrieveResponse(answer=format_exemplars(meta.memory_list), metadata=meta)
        answer = prompts.format_memories(meta.memory_list)
        if rewrite and hits:
            rewritten = (await self._ask(prompts.REWRITE_SYSTEM,
                                         f"New task: {query}\n\nStored experiences:\n"
                                         f"{prompts.numbered_candidates(meta.memory_list)}")).strip()
            if rewritten:
                answer, meta.rewritten = rewritten, True
            else:
                meta.notes.append("the rewrite reply was empty; the experiences are returned as stored")
        return RetrieveResponse(answer=answer, metadata=meta)

    async def _search(self, workspace_id: str, vector: np.ndarray, k: int, kind: ExperienceKind | None,
                      excluded_tasks: frozenset[str] = frozenset()) -> list[SearchHit]:
        """The ``k`` nearest memories, of ``kind`` only when one is asked for and of none of the excluded
        tasks (the recall is widened x4 per round until ``k`` are found or the workspace is exhausted)."""
        if kind is None and not excluded_tasks:
            return await asyncio.to_thread(self.store.search, workspace_id, vector, k)

        def wanted(hit: SearchHit) -> bool:
            return ((kind is None or memory_kind(hit.memory) == kind)
                    and str(hit.memory.metadata.get("task_id", "")) not in excluded_tasks)

        total = await asyncio.to_thread(self.store.count, workspace_id)
        recall = k
        while True:
            recall = min(recall * 4, total)
            hits = await asyncio.to_thread(self.store.search, workspace_id, vector, recall)
            found = [h for h in hits if wanted(h)]
            if len(found) >= k or recall >= total:
                return found[:k]

    async def _ask(self, system: str, user: str) -> str:
        assert self.llm is not None
        try:
            result = await self.llm.achat([{"role": "system", "content": system}, {"role": "user", "content": user}])
        except LLMError as err:
            raise LLMFailed(f"the rerank/rewrite LLM failed: {err}") from err
        return result.text

    async def _rerank(self, query: str, hits: list[SearchHit], meta: RetrieveMetadata) -> list[SearchHit]:
        """The candidates the LLM picked, in its order (it may leave out those that do not apply)."""
        reply = await self._ask(prompts.RERANK_SYSTEM, f"New task: {query}\n\nStored experiences:\n"
                                f"{prompts.numbered_candidates([h.memory for h in hits])}")
        order = prompts.parse_ranking(reply, len(hits))
        if order is None:
            logger.warning("rerank reply holds no JSON array; keeping vector order: %.200r", reply)
            meta.notes.append("the rerank reply held no JSON array; vector order kept")
            return hits
        meta.reranked = True
        return [hits[i] for i in order]
