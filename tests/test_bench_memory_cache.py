"""The query-embedding cache of the memory service's retriever (the fix bench/memory_http.py measured).

A GRPO group's ``rollout.n`` episodes ask for their task's experience with the same text at the same moment:
the first request embeds it, the others wait on that one embedding, and later requests take it from the
cache; a failed embedding is not cached. The embedder here counts its calls (no model is loaded).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from agentevolver.memory_service.retriever import Retriever
from agentevolver.memory_service.settings import RetrieveSettings


class CountingEmbedder:
    identity = "counting"
    dim = 4

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.05)  # long enough for concurrent requests to find the embedding running
        with self._lock:
            self.calls.extend(texts)
        if self.fail:
            raise RuntimeError("embedding backend down")
        return np.full((len(texts), self.dim), float(len(texts[0])), dtype=np.float32)


def _retriever(embedder: CountingEmbedder, size: int = 4096) -> Retriever:
    return Retriever(RetrieveSettings(query_cache_size=size), None, embedder, store=None)  # type: ignore[arg-type]


def test_a_group_asking_at_once_embeds_its_query_once_and_later_asks_hit_the_cache() -> None:
    embedder = CountingEmbedder()
    retriever = _retriever(embedder)

    async def group() -> list[np.ndarray]:
        return await asyncio.gather(*(retriever.embed_query("task 7") for _ in range(8)))

    vectors = asyncio.run(group())
    assert embedder.calls == ["task 7"] and all(np.array_equal(v, vectors[0]) for v in vectors)
    assert asyncio.run(retriever.embed_query("task 7")).tolist() == vectors[0].tolist()
    assert embedder.calls == ["task 7"]
    assert retriever.cache_stats == {"hits": 1, "misses": 1, "shared": 7} and retriever.cache_size == 1


def test_the_cache_drops_the_least_recently_used_and_size_0_turns_it_off() -> None:
    embedder = CountingEmbedder()
    retriever = _retriever(embedder, size=2)
    for query in ("a", "bb", "a", "ccc", "bb"):  # "bb" was dropped when "ccc" came in ("a" was used later)
        asyncio.run(retriever.embed_query(query))
    assert embedder.calls == ["a", "bb", "ccc", "bb"] and retriever.cache_size == 2
    off = CountingEmbedder()
    uncached = _retriever(off, size=0)
    for _ in range(3):
        asyncio.run(uncached.embed_query("a"))
    assert off.calls == ["a", "a", "a"] and uncached.cache_size == 0


def test_a_failed_embedding_reaches_every_waiter_and_is_not_cached() -> None:
    embedder = CountingEmbedder(fail=True)
    retriever = _retriever(embedder)

    async def group() -> list[BaseException | np.ndarray]:
        return await asyncio.gather(*(retriever.embed_query("q") for _ in range(3)), return_exceptions=True)

    assert all(isinstance(result, RuntimeError) for result in asyncio.run(group()))
    with pytest.raises(RuntimeError, match="backend down"):
        asyncio.run(retriever.embed_query("q"))
    assert embedder.calls == ["q", "q"] and retriever.cache_size == 0
