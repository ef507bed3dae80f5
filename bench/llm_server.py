"""Local LLM server throughput: serial requests vs N concurrent requests, against the generator without HTTP.

    .venv/bin/python bench/llm_server.py [--model smollm2-135m-instruct] [--requests 8] [--max-tokens 64]
                                         [--concurrency 4,8]

Starts the real server (``python -m agentevolver.llm_server``) on a free port and sends the same chat
requests (different user questions, greedy, ``ignore_eos`` so every reply is exactly ``--max-tokens``
tokens) through the official ``openai`` SDK:

* ``serial``: one request after the other (what a server that runs one ``generate`` at a time, such as
  ``transformers serve``, gives at best): the baseline, 1.00x;
* ``concurrent N``: N requests in flight at once (the server batches them into shared decodes);
* ``in-process generator``: the same prompts straight into ``HFGenerator`` in this process, all at once,
  with no HTTP: the ceiling, showing what the HTTP layer costs.

The table reports generated tokens per second, ratios against ``serial``, mean request latency, and the
server's own batch counters (``/stats``: mean rows per decode).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from test_llm_server import llm_server  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer in two or three sentences."
TOPICS = ["the moon", "bread", "rivers", "chess", "bicycles", "volcanoes", "libraries", "owls", "glass", "rain",
          "bridges", "tea", "maps", "snow", "clocks", "bees"]


def messages(index: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me something interesting about {TOPICS[index % len(TOPICS)]}."}]


async def one(client: openai.AsyncOpenAI, model: str, index: int, max_tokens: int) -> tuple[int, float]:
    started = time.perf_counter()
    reply = await client.chat.completions.create(
        model=model, messages=messages(index), max_tokens=max_tokens, temperature=0,  # type: ignore[arg-type]
        extra_body={"ignore_eos": True},
    )
    return reply.usage.completion_tokens, time.perf_counter() - started  # type: ignore[union-attr]


async def run_mode(base_url: str, stats_url: str, model: str, requests: int, concurrency: int,
                   max_tokens: int) -> dict[str, Any]:
    """Send ``requests`` requests with at most ``concurrency`` in flight; return tokens/s and batch counters."""
    before = httpx.get(stats_url, timeout=60).json()["generator"]
    gate = asyncio.Semaphore(concurrency)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600) as client:

        async def gated(index: int) -> tuple[int, float]:
            async with gate:
                return await one(client, model, index, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(gated(i) for i in range(requests)))
        seconds = time.perf_counter() - started
    after = httpx.get(stats_url, timeout=60).json()["generator"]
    tokens = sum(t for t, _ in results)
    batches = after["batches"] - before["batches"]
    return {"tokens": tokens, "seconds": seconds, "latency": statistics.mean(s for _, s in results),
            "rows_per_batch": (after["rows"] - before["rows"]) / max(batches, 1)}


async def in_process(model: str, requests: int, max_tokens: int, threads: int | None) -> dict[str, Any]:
    """The same prompts straight into the generator (no HTTP, no JSON): the ceiling for ``concurrent``."""
    import torch

    from agentevolver.backends.cpu import HFGenerator

    if threads:
        torch.set_num_threads(threads)
    generator = HFGenerator.from_pretrained(model, max_batch_size=max(requests, 1))
    tokenizer = generator.tokenizer
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(messages(i), add_generation_prompt=True,
                                                              tokenize=False), add_special_tokens=False)
               for i in range(requests)]
    params = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    async with generator:
        await generator.generate("warm-up", prompt_ids=prompts[0], sampling_params={**params, "max_tokens": 2})
        started = time.perf_counter()
        outputs = await asyncio.gather(*(generator.generate(f"b{i}", prompt_ids=p, sampling_params=params)
                                         for i, p in enumerate(prompts)))
        seconds = time.perf_counter() - started
    return {"tokens": sum(len(o.token_ids) for o in outputs), "seconds": seconds, "latency": seconds,
            "rows_per_batch": float(requests)}


def progress(name: str, result: dict[str, Any]) -> None:
    print(f"{name}: {result['tokens']} tokens in {result['seconds']:.1f} s", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=8, help="requests per mode")
    parser.add_argument("--max-tokens", type=int, default=64, help="generated tokens per request")
    parser.add_argument("--concurrency", default="4,8", help="comma-separated in-flight limits to measure")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, server and in-process (the server's --threads; 0 = torch's default)")
    args = parser.parse_args()
    extra = ["--threads", str(args.threads)]
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]

    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as tmp, llm_server(Path(tmp), *extra, model=args.model) as server:
        stats_url = f"{server.url}/stats"
        # warm-up: the first forward pass of a fresh process is slow
        asyncio.run(run_mode(server.base_url, stats_url, args.model, 1, 1, 2))
        for level in [1, *levels]:
            name = "serial (1 in flight)" if level == 1 else f"concurrent ({level} in flight)"
            rows.append((name, asyncio.run(
                run_mode(server.base_url, stats_url, args.model, args.requests, level, args.max_tokens))))
            progress(*rows[-1])
    rows.append(("in-process generator, all at once (no HTTP)",
                 asyncio.run(in_process(args.model, args.requests, args.max_tokens, args.threads))))
    progress(*rows[-1])

    baseline = rows[0][1]["tokens"] / rows[0][1]["seconds"]
    threads = f", {args.threads} torch thread(s)" if args.threads else ", torch's default threads"
    table = Table(title=f"{args.model}: {args.requests} chat requests x {args.max_tokens} tokens (greedy{threads})")
    for column in ("mode", "tokens/s", "vs serial", "mean latency (s)", "rows per decode"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for name, result in rows:
        rate = result["tokens"] / result["seconds"]
        table.add_row(name, f"{rate:.1f}", f"{rate / baseline:.2f}x", f"{result['latency']:.2f}",
                      f"{result['rows_per_batch']:.1f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
