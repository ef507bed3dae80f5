"""Shared pytest setup: offline mode for every test, and `gpu` tests skipped where there is no GPU."""

from __future__ import annotations

import os

import pytest

# Model hubs are unreachable here; prove that nothing tries them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Two xdist workers (and each training test's Ray processes and services) compute side by side on a few cores.
# torch's OpenMP threads busy-wait between parallel regions by default, holding a core another process's
# thread needs: two CPU generators decoding at once ran 3.4x slower, and one beside a running ablation 16x
# (bench/omp_wait_policy.py, docs/benchmarks.md). Idle threads sleep instead. Set before anything imports
# torch (libgomp reads it when it loads); the test's children (Ray workers, services) inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


#: Memory one xdist worker may need: a training run holds a driver, Ray's processes and five actors (~4 GiB RSS).
WORKER_MEMORY_GIB = 6


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, but no more than the memory holds (a 16-core, 32 GiB machine gets 5),
    so parallel training runs never push the machine into swap. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` overrides."""
    import psutil

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    by_memory = int(psutil.virtual_memory().total / 2**30 // WORKER_MEMORY_GIB)
    return max(1, min(cores, by_memory))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked `alone` beside other xdist workers, and tests marked `gpu` unless CUDA is available
    (torch is only imported when such tests exist)."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:  # set by xdist in each worker
        alone = pytest.mark.skip(reason="needs the machine to itself (memory): scripts/test.sh runs it after the suite; "
                                        "alone: `pytest -n 0 -m alone`")
        for item in items:
            if "alone" in item.keywords:
                item.add_marker(alone)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


# A scripted OpenAI-compatible server (a test double at the edge) that plays any LLM role: `scripted_llm`.
# Imported by module name: verl installs an unrelated top-level `tests` package into site-packages.
from scripted_openai_server import scripted_llm  # noqa: E402, F401
