"""Retrieval latency of the experience memory at 1k, 10k and 100k stored experiences.

    .venv/bin/python bench/memory.py [--sizes 1000,10000,100000] [--queries 200] [--top-k 3] [--no-http]
                                     [--search-threads 1] [--embed-threads 1]

For each size, a fresh data folder is filled through the real store (``FaissStore``: SQLite + faiss) with
synthetic experiences. Embedding 100k texts with MiniLM on a 2-core CPU would take many minutes, so the
stored vectors are random unit vectors (the store records the MiniLM identity, so the real service opens
the folder); only the queries are real MiniLM embeddings of text. Exact search does the same work whatever
the vectors are, so latency is unaffected; relevance is not measured here (the tests do that).

Measured per size, in one process, with the same query vectors:

* ``numpy``: the baseline, brute-force ``M @ q`` + ``argpartition`` over all vectors held in RAM (no record
  fetch);
* ``store``: ``FaissStore.search`` (faiss exact inner product + fetching the top-k records from SQLite),
  after one warm-up search that builds the index from SQLite (its time is the ``index load`` column);
* ``HTTP``: ``POST /retrieve_task_memory`` with the query *text* against the real service started on that
  folder (``python -m agentevolver.memory_service``): embedding + search + formatting + HTTP, sequential.

Ratios are numpy p50 / store p50 (>1 = the store is faster despite also fetching records). Every side runs
single-threaded (numpy's BLAS via OPENBLAS_NUM_THREADS=1, faiss and torch by the service's defaults
``store.search_threads`` / ``embedding.threads`` = 1), so the comparison is of algorithms, not of thread
pools fighting over a shared CPU; ``--search-threads 2 --embed-threads 2`` measures what more threads do.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads its BLAS

import argparse
import contextlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.embedders import Embedder, EmbeddingSettings, build_embedder  # noqa: E402
from agentevolver.memory_service.settings import StoreSettings  # noqa: E402
from agentevolver.memory_service.store import FaissStore  # noqa: E402
from agentevolver.schema.memory_wire import TaskMemory  # noqa: E402

WORKSPACE = "bench"
TOPICS = ["sorting numbers", "booking flights", "sending email", "parsing dates", "reading files",
          "querying a database", "calling a REST API", "unit conversion", "string formatting", "web search"]


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds."""
    values = np.asarray(samples) * 1000.0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def fill(store: FaissStore, n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """Upsert ``n`` synthetic experiences with random unit vectors in chunks; returns the vectors."""
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunk = 10_000
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        memories = [TaskMemory(workspace_id=WORKSPACE, when_to_use=f"tasks about {TOPICS[i % len(TOPICS)]} #{i}",
                               content=f"Synthetic experience {i}: check the inputs of {TOPICS[i % len(TOPICS)]} "
                                       "before calling a tool, and verify the result it returns.",
                               author="bench") for i in range(start, stop)]
        store.upsert(WORKSPACE, memories, vectors[start:stop])
    return vectors


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_service(data_dir: Path, log: Path, threads: tuple[int, int]) -> Iterator[str]:
    port = free_port()
    config = data_dir.parent / "service.yaml"
    config.write_text(f"store: {{search_threads: {threads[0]}}}\nembedding: {{threads: {threads[1]}}}\n")
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "agentevolver.memory_service", "--port", str(port),
                                    "--data-dir", str(data_dir), "--config", str(config), "--log-level", "warning"],
                                   cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"memory service exited:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def brute_force(vectors: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    """The baseline: every score, then the top k in order."""
    scores = vectors @ q
    top = np.argpartition(-scores, k)[:k]
    return top[np.argsort(-scores[top])]


def http_latencies(data: Path, log: Path, texts: list[str], k: int, threads: tuple[int, int]) -> list[float]:
    """Sequential POST /retrieve_task_memory against the real service on ``data``."""
    with running_service(data, log, threads) as url, httpx.Client(base_url=url, timeout=60) as client:
        def ask(text: str) -> None:
            client.post("/retrieve_task_memory", json={"workspace_id": WORKSPACE, "query": text, "top_k": k}
                        ).raise_for_status()

        ask(texts[0])  # warm-up: builds the index from SQLite
        return [timed(lambda t=t: ask(t), 1)[0] for t in texts]


def measure(n: int, embedder: Embedder, queries: np.ndarray, texts: list[str], k: int, http: bool,
            rng: np.random.Generator, threads: tuple[int, int]) -> list[str]:
    """One table row for ``n`` stored experiences."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        data = Path(tmp) / "data"
        store = FaissStore(data, embedder.identity, embedder.dim, StoreSettings(search_threads=threads[0]))
        started = time.perf_counter()
        vectors = fill(store, n, embedder.dim, rng)
        fill_s = time.perf_counter() - started
        load = timed(lambda: store.search(WORKSPACE, queries[0], k), 1)[0]
        numpy_t = [timed(lambda q=q: brute_force(vectors, q, k), 1)[0] for q in queries]
        store_t = [timed(lambda q=q: store.search(WORKSPACE, q, k), 1)[0] for q in queries]
        same = [h.memory.when_to_use for h in store.search(WORKSPACE, queries[1], k)]
        assert same == [f"tasks about {TOPICS[i % len(TOPICS)]} #{i}" for i in brute_force(vectors, queries[1], k)]
        store.close()
        http_cell = "-"
        if http:
            http_cell = "{:.1f} / {:.1f}".format(*percentiles(http_latencies(data, Path(tmp) / "svc.log", texts, k,
                                                                                   threads)))
    (np50, np99), (st50, st99) = percentiles(numpy_t), percentiles(store_t)
    return [f"{n:,}", f"{fill_s:.1f}", f"{load * 1000:.0f}", f"{np50:.2f} / {np99:.2f}", f"{st50:.2f} / {st99:.2f}",
            f"{np50 / st50:.2f}x", http_cell]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--no-http", action="store_true", help="skip the end-to-end HTTP column")
    parser.add_argument("--search-threads", type=int, default=1, help="faiss OpenMP threads (store.search_threads)")
    parser.add_argument("--embed-threads", type=int, default=1, help="torch threads (embedding.threads)")
    args = parser.parse_args()
    threads = (args.search_threads, args.embed_threads)
    console = Console(width=150)

    embedder = build_embedder("sentence_transformers", EmbeddingSettings(threads=args.embed_threads))
    texts = [f"How should I approach {TOPICS[i % len(TOPICS)]} in task {i}?" for i in range(args.queries)]
    embedder.embed(texts[:8])  # warm-up (torch's first call allocates)
    embed_times = timed(lambda: embedder.embed([texts[0]]), 50)
    queries = embedder.embed(texts)
    rng = np.random.default_rng(0)

    table = Table(title=f"retrieval latency (ms), top_k={args.top_k}, {args.queries} queries, faiss threads "
                        f"{args.search_threads}, torch threads {args.embed_threads}")
    for column in ("stored", "fill (s)", "index load (ms)", "numpy p50 / p99", "store p50 / p99", "numpy / store",
                   "HTTP p50 / p99"):
        table.add_column(column, justify="right")
    for n in (int(s) for s in args.sizes.split(",")):
        table.add_row(*measure(n, embedder, queries, texts, args.top_k, not args.no_http, rng, threads))
        console.print(f"done: {n:,} stored")
    console.print(table)
    e50, e99 = percentiles(embed_times)
    console.print(f"query embedding alone (MiniLM, 1 text): p50 {e50:.1f} ms / p99 {e99:.1f} ms")


if __name__ == "__main__":
    main()
