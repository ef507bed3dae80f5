"""How many pytest-xdist workers the machine's memory holds, and whether the `alone` tests fit beside them.

tests/conftest.py sizes ``-n auto`` with :func:`auto_num_workers`; scripts/test.sh runs this file to ask whether
the `alone` tests (verl's vLLM rollout on CPU, in a pytest process of their own) may run beside the suite or must
wait for it. Its own module so that the shell asks without starting pytest.
"""

from __future__ import annotations

import os
import sys

import psutil

#: Memory one xdist worker may need: a training run holds a driver, Ray's processes and five actors (~4 GiB RSS).
WORKER_MEMORY_GIB = 6
#: Memory the `alone` process may need: one vLLM training run (the trainer, vLLM's server and engine core, 1 GiB of
#: KV cache). Measured beside the suite's two workers on a 24 GiB machine (2026-12-07): MemAvailable fell from
#: 22.6 to 9.4 GiB at the lowest (1-second samples), so all three together used at most ~13 GiB.
ALONE_MEMORY_GIB = 8


def auto_num_workers() -> int:
    """``-n auto``: one worker per core, but no more than the memory holds (a 16-core, 32 GiB machine gets 5),
    so parallel training runs never push the machine into swap. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    by_memory = int(psutil.virtual_memory().total / 2**30 // WORKER_MEMORY_GIB)
    return max(1, min(cores, by_memory))


def alone_fits_beside(available_gib: float, workers: int) -> bool:
    """Whether the `alone` process fits in ``available_gib`` beside ``workers`` xdist workers, each at its share."""
    return available_gib >= workers * WORKER_MEMORY_GIB + ALONE_MEMORY_GIB


def placement() -> str:
    """``beside ...`` or ``after ...`` with the figures that decided it (scripts/test.sh reads the first word)."""
    available = psutil.virtual_memory().available / 2**30
    workers = auto_num_workers()
    need = workers * WORKER_MEMORY_GIB + ALONE_MEMORY_GIB
    verdict = "beside the suite" if alone_fits_beside(available, workers) else "after the suite"
    return (f"{verdict} ({available:.1f} GiB available; {workers} xdist worker(s) x {WORKER_MEMORY_GIB} GiB + "
            f"{ALONE_MEMORY_GIB} GiB = {need} GiB)")


if __name__ == "__main__":
    print(placement())
    sys.exit(0)
