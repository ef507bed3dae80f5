"""tests/memory_budget.py: the xdist worker count by cores and memory, and where scripts/test.sh puts the `alone`
tests (beside the suite only where the free memory holds every worker's share and theirs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import memory_budget
import pytest


@pytest.mark.parametrize(("available_gib", "workers", "beside"), [
    (23.0, 2, True),    # the 24 GiB, 2-core machine at rest: 2 x 6 + 8 = 20
    (19.9, 2, False),   # the same machine with something else holding memory
    (30.0, 5, False),   # a 16-core, 32 GiB machine: five workers already take its memory
    (8.0, 0, True),
])
def test_the_alone_tests_go_beside_the_suite_only_where_the_memory_holds_both(
        available_gib: float, workers: int, beside: bool) -> None:
    assert memory_budget.alone_fits_beside(available_gib, workers) is beside


def test_the_worker_count_is_capped_by_memory_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory:
        total = 32 * 2**30

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(memory_budget.psutil, "cpu_count", lambda logical=True: 16)
    monkeypatch.setattr(memory_budget.psutil, "virtual_memory", lambda: Memory)
    assert memory_budget.auto_num_workers() == 5
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert memory_budget.auto_num_workers() == 3


def test_scripts_test_sh_reads_a_verdict_from_the_script() -> None:
    """scripts/test.sh runs the file from tests/ and branches on the first word."""
    out = subprocess.run([sys.executable, "memory_budget.py"], cwd=Path(memory_budget.__file__).parent,
                         capture_output=True, text=True, check=True).stdout
    assert out.split()[0] in ("beside", "after") and "GiB available" in out, out
