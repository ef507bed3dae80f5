"""tests/memory_budget.py: the xdist worker count by cores and memory, and whether the `alone` tests (verl's vLLM
rollout on CPU) run inside the suite (only where the free memory holds one on every worker at once) or after it;
and tests/conftest.py's skip of them among workers, which only scripts/test.sh's verdict lifts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import memory_budget
import pytest

TESTS = Path(memory_budget.__file__).parent


@pytest.mark.parametrize(("available_gib", "workers", "in_suite"), [
    (22.6, 2, True),    # the 24 GiB, 2-core machine at rest: 2 x 8 = 16
    (15.9, 2, False),   # the same machine with something else holding memory
    (30.0, 5, False),   # a 16-core, 32 GiB machine: five workers at 8 GiB each do not fit
    (8.0, 1, True),
])
def test_the_alone_tests_join_the_suite_only_where_the_memory_holds_one_per_worker(
        available_gib: float, workers: int, in_suite: bool) -> None:
    assert memory_budget.alone_fits_in_suite(available_gib, workers) is in_suite


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
    out = subprocess.run([sys.executable, "memory_budget.py"], cwd=TESTS, capture_output=True, text=True,
                         check=True).stdout
    assert out.split()[0] in ("in", "after") and "GiB available" in out, out


ALONE_PROBE = '''
import pytest

@pytest.mark.alone
def test_alone():
    pass

def test_plain():
    pass
'''


@pytest.mark.parametrize(("in_suite", "outcome"), [("", "1 passed, 1 skipped"), ("1", "2 passed")])
def test_alone_tests_skip_among_workers_unless_test_sh_found_the_memory(
        tmp_path: Path, in_suite: str, outcome: str) -> None:
    """The real tests/conftest.py on a file with one `alone` test, as one of two xdist workers sees it (the worker
    count is the variable xdist sets in each worker; one process here, which starts in a third of the time)."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(ALONE_PROBE)
    env = {**os.environ, memory_budget.ALONE_IN_SUITE: in_suite, "PYTEST_XDIST_WORKER_COUNT": "2",
           "AGENTEVOLVER_TEST_SECONDS_OUT": ""}
    # the probe lives outside tests/, so tests/conftest.py is loaded as a plugin (`-p conftest`, from this folder)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "-c", str(TESTS.parent / "pyproject.toml"), "-n", "0", str(probe)],
                          cwd=TESTS, capture_output=True, text=True, env=env)
    assert outcome in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
