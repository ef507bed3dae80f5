"""Smoke runs of the load benchmarks (bench/env_scale.py, bench/memory_http.py) with their ``--small`` sizes.

Each script runs for real through its entry point (it starts the real services), so a change that breaks
one fails here instead of at the next measurement. No timing is asserted: the numbers belong to
docs/benchmarks.md, measured on a machine as idle as can be had.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("script", "expected"), [
    ("env_scale.py", ["live instances", "MiB / instance", "p99 ms", "service process tree"]),
    ("memory_http.py", ["in-process", "HTTP - in-process", "grouped", "embed", "index", "JSON"]),
])
def test_bench_script_runs_small(script: str, expected: list[str]) -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / script), "--small"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in (*expected, "load average"):
        assert text in done.stdout, done.stdout


def test_allocator_bench_runs_small() -> None:
    """bench/allocator.py: two allocator settings in fresh processes, the update workload, tiny sizes."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "allocator.py"), "--small", "--repeats", "1",
                           "--model", "tiny-test", "--allocators", "glibc-tuned", "--workloads", "update"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("update", "default", "glibc-tuned", "wall vs default", "load"):
        assert text in done.stdout, done.stdout


def test_omp_wait_policy_bench_runs_small() -> None:
    """bench/omp_wait_policy.py: both workloads under both policies in fresh processes, tiny-test, one copy."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "omp_wait_policy.py"), "--repeats", "1",
                           "--model", "tiny-test", "--together", "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("decode", "update", "default", "passive", "vs default", "load"):
        assert text in done.stdout, done.stdout
