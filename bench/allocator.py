"""Memory allocators on the CPU backend: generation and the actor update under each, as ratios to glibc's default.

    .venv/bin/python bench/allocator.py [--model smollm2-135m-instruct] [--repeats 2] [--small]
                                        [--allocators default,glibc-tuned,jemalloc,tcmalloc]
                                        [--workloads generate,update]

glibc's malloc serves large blocks with ``mmap`` and gives them back with ``munmap`` on ``free``; a PyTorch
step allocates and frees the same large activation and logits buffers again and again, so the kernel maps
and zero-fills (page-faults) them in on every step. The settings compared, each in fresh processes (an
allocator is chosen when a process starts):

* ``default``: glibc as it comes;
* ``glibc-tuned``: :data:`agentevolver.backends.cpu.allocator.GLIBC_TUNED` (a huge mmap threshold, no
  trimming, a large top pad: freed buffers stay in the heap and are reused);
* ``jemalloc`` / ``tcmalloc``: ``LD_PRELOAD`` of Debian's ``libjemalloc2`` / ``libtcmalloc-minimal4`` when
  installed (skipped, and said so, when not).

Workloads (one process each, the same seeds): ``generate`` (the batched CPU generator, 8 sampled responses of
up to 128 tokens to a ~120-token prompt) and ``update`` (forward + backward + AdamW over 4 x 512 tokens).
Each prints its wall, user and system (kernel) seconds; the table gives the median over ``--repeats`` and the
ratio of wall time to ``default``. The settings alternate inside each repeat, so a change of load hits all.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.backends.cpu.allocator import ALLOCATORS, allocator_env  # noqa: E402
from agentevolver.errors import ConfigError  # noqa: E402


def settings() -> dict[str, dict[str, str] | None]:
    """Each setting's extra environment (what a run gets, agentevolver/backends/cpu/allocator.py), None where
    its library is not installed."""
    found: dict[str, dict[str, str] | None] = {}
    for name in ALLOCATORS:
        try:
            found[name] = allocator_env(name)
        except ConfigError:  # jemalloc / tcmalloc not installed
            found[name] = None
    return found


def worker(workload: str, model_name: str, small: bool) -> None:
    """Run one workload in this process and print its times as JSON (the parent reads the last line)."""
    import asyncio

    import torch

    from agentevolver.backends.cpu import HFGenerator
    from agentevolver.models import resolve_model_path

    torch.manual_seed(0)
    path = str(resolve_model_path(model_name))
    tokens = 32 if small else 128
    begin, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    if workload == "generate":
        generator = HFGenerator.from_pretrained(path, seed=0)
        prompt = generator.tokenizer("Compute 17 * 23 with the calculator tool and explain each step. " * 8)["input_ids"]

        async def run() -> None:
            params = {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "max_tokens": tokens, "logprobs": True}
            await asyncio.gather(*(generator.generate(f"r{i}", prompt_ids=list(prompt), sampling_params=params)
                                   for i in range(8)))
            await generator.aclose()

        begin, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)  # after the model load
        asyncio.run(run())
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        length = 128 if small else 512
        ids = torch.randint(0, model.config.vocab_size, (4, length))
        begin, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(2):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    after = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall": time.perf_counter() - begin, "user": after.ru_utime - usage.ru_utime,
                      "sys": after.ru_stime - usage.ru_stime}))


def measure(workload: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--worker", workload, "--model", args.model, *(["--small"] if args.small else [])]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{workload} under {env} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="short sequences (a smoke run)")
    parser.add_argument("--allocators", default="default,glibc-tuned,jemalloc,tcmalloc",
                        help="comma list of settings to compare (default is always measured: the baseline)")
    parser.add_argument("--workloads", default="generate,update", help="comma list: generate, update")
    parser.add_argument("--worker", choices=["generate", "update"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.small)
        return
    from rich.console import Console
    from rich.table import Table

    wanted = {"default", *args.allocators.split(",")}
    options = {name: env for name, env in settings().items() if name in wanted}
    usable = {name: env for name, env in options.items() if env is not None}
    workloads = [w for w in ("generate", "update") if w in args.workloads.split(",")]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    load_before = os.getloadavg()
    for workload in workloads:
        for _ in range(args.repeats):
            for name, env in usable.items():
                results.setdefault((workload, name), []).append(measure(workload, env, args))
    load_after = os.getloadavg()
    table = Table(title=f"allocators ({args.model}, median of {args.repeats}; load {load_before[0]:.2f} -> "
                        f"{load_after[0]:.2f})")
    for column in ("workload", "allocator", "wall s", "user s", "sys s", "wall vs default"):
        table.add_column(column)
    for workload in workloads:
        base = statistics.median(r["wall"] for r in results[(workload, "default")])
        for name in usable:
            runs = results[(workload, name)]
            wall = statistics.median(r["wall"] for r in runs)
            table.add_row(workload, name, f"{wall:.2f}", f"{statistics.median(r['user'] for r in runs):.2f}",
                          f"{statistics.median(r['sys'] for r in runs):.2f}", f"{base / wall:.2f}x")
    Console().print(table)
    for name, env in options.items():
        if env is None:
            print(f"{name}: not installed (Debian: apt-get install {'libjemalloc2' if name == 'jemalloc' else 'libtcmalloc-minimal4'})")


if __name__ == "__main__":
    main()
