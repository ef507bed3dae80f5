"""How many pytest-xdist workers the machine's memory holds, and whether the `alone` tests may run among them.

The `alone` tests (verl's vLLM rollout training on CPU) need more memory than a worker's share. Where the free
memory holds one of them on every worker at once, scripts/test.sh runs them inside the suite's xdist session
(``ALONE_IN_SUITE=1``): a vLLM run keeps only ~1.2 of two cores busy (start-up steps one at a time), and the other
worker fills the rest. Elsewhere they skip among the workers and run after the suite with one process.
tests/conftest.py reads both decisions; scripts/test.sh runs this file to ask the second one without starting
pytest.
"""

from __future__ import annotations

import os
import sys

import psutil

#: Memory one xdist worker may need: a training run holds a driver, Ray's processes and five actors (~4 GiB RSS).
WORKER_MEMORY_GIB = 6
#: Memory one `alone` test may need: a vLLM training run (its own local Ray, the trainer's actors, vLLM's server
#: and engine core, 1 GiB of KV cache). Measured (2026-12-07, docs/benchmarks.md, "The alone tests inside the
#: suite"): the suite with both vLLM tests inside it, which started side by side, took MemAvailable on a 24 GiB
#: machine from 23.0 GiB to no lower than 10.1 (1-second samples), so two workers used at most ~13 GiB.
ALONE_MEMORY_GIB = 8
#: Set to 1 by scripts/test.sh when the `alone` tests run inside the suite; otherwise they skip among workers.
ALONE_IN_SUITE = "AGENTEVOLVER_TEST_ALONE_IN_SUITE"


def auto_num_workers() -> int:
    """``-n auto``: one worker per core, but no more than the memory holds (a 16-core, 32 GiB machine gets 5),
    so parallel training runs never push the machine into swap. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    by_memory = int(psutil.virtual_memory().total / 2**30 // WORKER_MEMORY_GIB)
    return max(1, min(cores, by_memory))


def suite_need_gib(workers: int) -> int:
    """Memory for an `alone` test on every one of ``workers`` workers at once (xdist hands the files out in an order
    that can start them side by side), so nothing relies on which file runs when."""
    return max(workers, 1) * max(ALONE_MEMORY_GIB, WORKER_MEMORY_GIB)


def alone_fits_in_suite(available_gib: float, workers: int) -> bool:
    """Whether ``available_gib`` holds :func:`suite_need_gib` for ``workers`` workers."""
    return available_gib >= suite_need_gib(workers)


def placement() -> str:
    """``in the suite ...`` or ``after the suite ...`` with the figures that decided it (scripts/test.sh reads
    the first word: ``in`` or ``after``)."""
    available = psutil.virtual_memory().available / 2**30
    workers = auto_num_workers()
    need = suite_need_gib(workers)
    verdict = "in the suite" if alone_fits_in_suite(available, workers) else "after the suite"
    return f"{verdict} ({available:.1f} GiB available; {workers} xdist worker(s) x {ALONE_MEMORY_GIB} GiB = {need} GiB)"


if __name__ == "__main__":
    print(placement())
    sys.exit(0)
