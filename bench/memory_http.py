"""What one retrieval costs at 100k stored experiences, in process and over HTTP, and what the HTTP time is made of.

    .venv/bin/python bench/memory_http.py [--size 100000] [--queries 200] [--repeat 8] [--top-k 3] [--small]

A fresh data folder is filled through the real store with ``--size`` synthetic experiences (random unit
vectors, as in ``bench/memory.py``: exact search costs the same whatever the vectors). Two query workloads,
each ``--queries`` requests long, sequential:

* ``distinct``: every query is a new text (a cold cache: each one is embedded);
* ``grouped``: each text is asked ``--repeat`` times in a row, as the ``rollout.n`` episodes of one GRPO group
  ask for their task's experience (``--repeat`` = rollout.n).

Per workload, in one process on the same folder and texts: ``in-process``, ``MemoryService.retrieve`` end
to end (query-embedding cache, embedding, search, formatting; no HTTP), then the parts, each timed alone
(``embed``: MiniLM on one text, what a cache miss costs; ``index``: ``FaissStore.search`` of a ready vector,
faiss + the top-k records from SQLite; ``JSON``: serialising the answer and parsing it back), then ``HTTP``:
``POST /retrieve_task_memory`` against the real service started on the folder (``python -m
agentevolver.memory_service``). The share column divides each part's p50 by the HTTP p50 of the same
workload; ``HTTP - in-process`` is what the transport, FastAPI and JSON add. Single-threaded (the service's
defaults). The load average (``uptime``) is printed with the table: on a shared machine it moves every
column. ``--small`` is a smoke run (2,000 stored, 16 queries; ``tests/test_bench_scripts.py``).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads its BLAS

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from memory import TOPICS, WORKSPACE, fill, percentiles, running_service  # noqa: E402

from agentevolver.memory_service.service import MemoryService  # noqa: E402
from agentevolver.memory_service.settings import MemoryServiceSettings  # noqa: E402
from agentevolver.memory_service.store import FaissStore  # noqa: E402
from agentevolver.schema.memory_wire import RetrieveRequest, RetrieveResponse  # noqa: E402


def load() -> str:
    """The 1, 5 and 15-minute load averages, as ``uptime`` shows them."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def workloads(queries: int, repeat: int) -> dict[str, list[str]]:
    """Distinct texts, and texts asked ``repeat`` times each (none shared between the two workloads)."""
    distinct = [f"How should I approach {TOPICS[i % len(TOPICS)]} in task {i}?" for i in range(queries)]
    grouped = [f"What helps with {TOPICS[(i // repeat) % len(TOPICS)]} in group {i // repeat}?" for i in range(queries)]
    return {"distinct": distinct, "grouped": grouped}


def in_process(service: MemoryService, texts: list[str], k: int) -> dict[str, list[float]]:
    """Each part alone, then the service's retrieve end to end, per text (seconds)."""
    times: dict[str, list[float]] = {"embed": [], "index": [], "JSON": [], "in-process": []}
    vectors = service.embedder.embed(texts[:1])
    service.store.search(WORKSPACE, vectors[0], k)  # warm-up: the index is built from SQLite here

    async def run() -> None:
        for text in texts:
            started = time.perf_counter()  # first, so the query cache is as a request of this workload finds it
            answer = await service.retrieve(RetrieveRequest(workspace_id=WORKSPACE, query=text, top_k=k))
            times["in-process"].append(time.perf_counter() - started)
            started = time.perf_counter()
            vector = service.embedder.embed([text])[0]  # what a cache miss costs
            times["embed"].append(time.perf_counter() - started)
            started = time.perf_counter()
            service.store.search(WORKSPACE, vector, k)
            times["index"].append(time.perf_counter() - started)
            started = time.perf_counter()
            RetrieveResponse.model_validate(json.loads(answer.model_dump_json()))
            times["JSON"].append(time.perf_counter() - started)

    asyncio.run(run())
    return times


def over_http(url: str, texts: list[str], k: int) -> tuple[list[float], dict[str, int]]:
    """Sequential requests; also the service's query-cache counters for them."""
    with httpx.Client(base_url=url, timeout=120) as client:
        def cache() -> dict[str, int]:
            return client.get("/info").json()["metadata"]["query_cache"]

        def ask(text: str) -> float:
            started = time.perf_counter()
            client.post("/retrieve_task_memory", json={"workspace_id": WORKSPACE, "query": text, "top_k": k}
                        ).raise_for_status()
            return time.perf_counter() - started

        ask("warm-up: builds the index from SQLite")
        before = cache()
        times = [ask(text) for text in texts]
        after = cache()
        return times, {key: after[key] - before[key] for key in ("hits", "shared", "misses")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000, help="stored experiences")
    parser.add_argument("--queries", type=int, default=200, help="requests per workload")
    parser.add_argument("--repeat", type=int, default=8, help="grouped workload: asks per text (rollout.n)")
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="smoke run: 2,000 stored, 16 queries")
    args = parser.parse_args()
    if args.small:
        args.size, args.queries = 2_000, 16
    console = Console(width=150)
    texts = workloads(args.queries, args.repeat)
    before = load()
    with tempfile.TemporaryDirectory(prefix="bench-memory-http-") as tmp:
        data = Path(tmp) / "data"
        settings = MemoryServiceSettings(data_dir=data)
        service = MemoryService.open(settings)
        started = time.perf_counter()
        fill(service.store, args.size, service.embedder.dim, np.random.default_rng(0))
        console.print(f"filled {args.size:,} experiences in {time.perf_counter() - started:.1f} s")
        assert isinstance(service.store, FaissStore)
        parts = {name: in_process(service, batch, args.top_k) for name, batch in texts.items()}
        asyncio.run(service.aclose())
        caches: dict[str, dict[str, int]] = {}
        with running_service(data, Path(tmp) / "service.log", (1, 1)) as url:
            for name, batch in texts.items():
                parts[name]["HTTP"], caches[name] = over_http(url, batch, args.top_k)
    after = load()

    table = Table(title=f"one retrieval at {args.size:,} stored experiences, top_k {args.top_k}, {args.queries} "
                        f"sequential queries per workload (grouped: each text {args.repeat}x); load average "
                        f"1/5/15 min {before} before, {after} after")
    for column in ("workload", "part", "p50 ms", "p99 ms", "share of HTTP p50"):
        table.add_column(column, justify="right")
    for name, times in parts.items():
        http50 = percentiles(times["HTTP"])[0]
        for part in ("embed", "index", "JSON", "in-process", "HTTP"):
            p50, p99 = percentiles(times[part])
            table.add_row(name, part, f"{p50:.2f}", f"{p99:.2f}", f"{p50 / http50:.2f}")
        in50 = percentiles(times["in-process"])[0]
        table.add_row(name, "HTTP - in-process", f"{http50 - in50:.2f}", "", f"{(http50 - in50) / http50:.2f}")
    console.print(table)
    for name, counts in caches.items():
        console.print(f"{name}: the service's query cache answered {counts['hits']} of {args.queries} requests "
                      f"({counts['misses']} embedded)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
