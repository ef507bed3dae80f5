"""Shared pytest setup: offline mode for every test, `gpu` tests skipped where there is no GPU, and the slowest
test files handed out first (tests/file_order.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from file_order import SECONDS_FILE, FileSeconds, load_seconds, slowest_files_first
from memory_budget import ALONE_IN_SUITE, auto_num_workers

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


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker per core, as many as the memory holds (tests/memory_budget.py)."""
    return auto_num_workers()


class _RecordFileSeconds:
    """``AGENTEVOLVER_TEST_SECONDS_OUT=<json>``: write each test file's seconds at the end of the run
    (tests/file_order.py reads them to order the next runs)."""

    def __init__(self, path: Path) -> None:
        self.path, self.seconds = path, FileSeconds()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds.add(report.nodeid, report.duration)

    def pytest_sessionfinish(self) -> None:
        self.seconds.write(self.path)


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("AGENTEVOLVER_TEST_SECONDS_OUT")
    if out and not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sees every report
        config.pluginmanager.register(_RecordFileSeconds(Path(out)), "agentevolver_file_seconds")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop this process's shared Ray cluster of the training runs (tests/shared_ray.py), if one was started."""
    import shared_ray

    shared_ray.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the files slowest first (xdist's ``--no-loadscope-reorder`` keeps this order), skip tests marked
    `alone` beside other xdist workers unless scripts/test.sh found the memory for them there (tests/memory_budget.py),
    and tests marked `gpu` unless CUDA is available (torch is only imported when such tests exist)."""
    by_id = {item.nodeid: item for item in items}
    items[:] = [by_id[nodeid] for nodeid in slowest_files_first(by_id, load_seconds(SECONDS_FILE))]
    beside_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1  # set by xdist in each worker
    if beside_workers and os.environ.get(ALONE_IN_SUITE) != "1":
        alone = pytest.mark.skip(reason="needs more memory than a worker's share: scripts/test.sh runs it in the suite "
                                        "where the memory holds it (tests/memory_budget.py), else after it; alone: "
                                        "`pytest -n 0 -m alone`")
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
