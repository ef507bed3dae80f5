"""bench/trainer_paths.py without TransferQueue: its help, and the clear exit when transfer_queue is missing.

The measurement itself (two verl trainers, minutes per run) is not run here; docs/benchmarks.md has its
numbers.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "trainer_paths.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_flags():
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--steps", "--reps", "--out", "--tq-site"):
        assert flag in done.stdout


def test_missing_transfer_queue_exits_2_with_the_install_command(tmp_path: Path):
    if importlib.util.find_spec("transfer_queue") is not None:
        pytest.skip("transfer_queue is importable in this environment")
    empty = tmp_path / "no_tq"
    empty.mkdir()
    done = _run("--tq-site", str(empty), "--workdir", str(tmp_path / "work"))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "transfer_queue cannot be imported" in done.stderr
    assert "pip install --no-deps --target" in done.stderr and "transferqueue==0.1.11" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "work").exists()  # nothing was started
