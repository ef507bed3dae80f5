"""One environment service holding 1,000 live ``calc`` instances: memory per instance, step latency at 64 clients.

    .venv/bin/python bench/env_scale.py [--instances 1000] [--clients 64] [--steps 1920] [--threads N] [--small]

Starts the real service (``env_service/env_service.py --env calc``) as a subprocess, then, through the real
async ``EnvClient``:

1. creates ``--clients`` instances and drives ``--steps`` steps with ``--clients`` concurrent clients, each
   stepping its own instances in turn (the baseline: as many live instances as clients);
2. creates instances up to ``--instances`` (the memory they add is the PSS of the service's whole process
   tree, so shared pages are not double counted), and drives the same steps again, now spread over every
   live instance: what holding 1,000 instances costs each step;
3. drives steps with one client (the service time of a step, with no queue behind other clients).

A step is a calculator tool call (``258 / 6``), the work an agent's step asks of calc; episodes run with
``params.max_steps`` 50 so no instance ends during the run. Ratios are against the baseline row. The
machine's load (``uptime``) is printed before and after: on a shared machine the latency columns move with it.
``--small`` is a smoke run (40 instances, 8 clients, 80 steps; ``tests/test_bench_scripts.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from env_hosting import tree_pss_mb  # noqa: E402
from env_service_fixture import env_service  # noqa: E402

from agentevolver.client.env_client import EnvClient, EnvClientSettings  # noqa: E402

ACTION = {"role": "assistant", "content": '<tool_call>\n{"name": "calculator", "arguments": {"expression": '
                                          '"258 / 6"}}\n</tool_call>'}
PARAMS = {"max_steps": 50}


def load() -> str:
    """The 1, 5 and 15-minute load averages, as ``uptime`` shows them."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


async def create(client: EnvClient, count: int, start: int) -> list[str]:
    """``count`` calc instances, on calc's train tasks in turn, 32 creations in flight at a time."""
    gate = asyncio.Semaphore(32)
    tasks = await client.aget_env_profile("calc", "train")

    async def one(index: int) -> str:
        async with gate:
            created = await client.acreate("calc", tasks[index % len(tasks)], params=PARAMS)
            return created.info.instance_id

    return list(await asyncio.gather(*(one(start + i) for i in range(count))))


async def drive(client: EnvClient, ids: list[str], clients: int, steps: int) -> tuple[float, list[float]]:
    """``steps`` steps by ``clients`` concurrent clients; client c steps ids c, c + clients, ... in turn."""
    latencies: list[float] = []
    per_client = max(1, steps // clients)

    async def worker(c: int) -> None:
        mine = ids[c::clients] or [ids[c % len(ids)]]
        for n in range(per_client):
            started = time.perf_counter()
            result = await client.astep(mine[n % len(mine)], ACTION)
            latencies.append(time.perf_counter() - started)
            if result.info.get("fallback") or result.is_terminated:
                raise RuntimeError(f"step failed or ended: {result.info}")

    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in range(clients)))
    return time.perf_counter() - started, latencies


def summary(seconds: float, latencies: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(latencies, n=100)
    return {"sps": len(latencies) / seconds, "p50": cuts[49] * 1000, "p99": cuts[98] * 1000}


async def measure(url: str, pid: int, instances: int, clients: int, steps: int) -> dict[str, dict[str, float]]:
    settings = EnvClientSettings(env_url=url, timeout_s=300, max_retries=0, max_connections=clients + 8)
    rows: dict[str, dict[str, float]] = {}
    async with EnvClient(settings) as client:
        await asyncio.sleep(1.0)
        empty = tree_pss_mb(pid)
        started = time.perf_counter()
        ids = await create(client, clients, 0)
        base_create = time.perf_counter() - started
        await drive(client, ids, clients, clients * 2)  # warm-up
        rows["baseline"] = {"live": clients, "clients": clients, "create_s": base_create,
                            "mib_per_instance": (tree_pss_mb(pid) - empty) / clients,
                            **summary(*await drive(client, ids, clients, steps))}
        started = time.perf_counter()
        ids += await create(client, instances - clients, clients)
        create_s = time.perf_counter() - started
        await asyncio.sleep(1.0)
        rows["full"] = {"live": instances, "clients": clients, "create_s": base_create + create_s,
                        "mib_per_instance": (tree_pss_mb(pid) - empty) / instances,
                        **summary(*await drive(client, ids, clients, steps))}
        rows["full"]["service_mib"] = tree_pss_mb(pid)
        rows["full"]["empty_mib"] = empty
        # one client: the service time of a step, without queueing behind the other clients
        rows["serial"] = {**rows["full"], "clients": 1, **summary(*await drive(client, ids, 1, max(20, steps // 16)))}
        await asyncio.gather(*(client.arelease(i) for i in ids))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1920, help="steps per measurement (all clients together)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the service's --threads (worker threads for inline instances; default its own, 32)")
    parser.add_argument("--small", action="store_true", help="smoke run: 40 instances, 8 clients, 80 steps")
    args = parser.parse_args()
    if args.small:
        args.instances, args.clients, args.steps = 40, 8, 80
    if args.instances < args.clients:
        parser.error(f"--instances ({args.instances}) must be >= --clients ({args.clients})")
    console = Console(width=160)
    before = load()
    with tempfile.TemporaryDirectory() as tmp, env_service(
            "calc", "--max-instances", str(args.instances + 16), "--idle-timeout", "3600",
            *(["--threads", str(args.threads)] if args.threads else []), tmp_path=Path(tmp)) as running:
        rows = asyncio.run(measure(running.url, running.process.pid, args.instances, args.clients, args.steps))
    after = load()

    threads = f"service --threads {args.threads}" if args.threads else "service threads: default"
    table = Table(title=f"one env service, calc, {threads}, {args.steps} steps per {args.clients}-client row "
                        f"(load average 1/5/15 min: {before} before, {after} after)")
    for column in ("live instances", "clients", "MiB / instance", "create all (s)", "steps/s", "vs baseline",
                   "p50 ms", "p99 ms", "p99 vs baseline"):
        table.add_column(column, justify="right")
    base = rows["baseline"]
    for row in rows.values():
        table.add_row(f"{row['live']:,.0f}", f"{row['clients']:.0f}", f"{row['mib_per_instance']:.3f}",
                      f"{row['create_s']:.1f}",
                      f"{row['sps']:.0f}", f"{row['sps'] / base['sps']:.2f}x", f"{row['p50']:.1f}",
                      f"{row['p99']:.1f}", f"{row['p99'] / base['p99']:.2f}x")
    console.print(table)
    full = rows["full"]
    console.print(f"service process tree: {full['empty_mib']:.0f} MiB with no instance, {full['service_mib']:.0f} MiB "
                  f"with {args.instances:,} live")
    return 0


if __name__ == "__main__":
    sys.exit(main())
