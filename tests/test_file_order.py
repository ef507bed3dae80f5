"""The suite's files go out slowest first (tests/file_order.py), and a run can record each file's seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from file_order import SECONDS_FILE, UNKNOWN_TEST_SECONDS, FileSeconds, load_seconds, slowest_files_first

REPO = Path(__file__).resolve().parents[1]


def test_files_go_slowest_first_and_keep_their_tests_in_order() -> None:
    nodeids = ["tests/a.py::x", "tests/b.py::x", "tests/a.py::y", "tests/c.py::x", "tests/b.py::y[1]",
               "tests/d.py::x"]
    # b measured slow, c measured fast; a (2 tests) and d (1 test) unmeasured: 2 and 1 per-test seconds
    order = slowest_files_first(nodeids, {"tests/b.py": 90.0, "tests/c.py": 0.5})
    assert order == ["tests/b.py::x", "tests/b.py::y[1]", "tests/a.py::x", "tests/a.py::y", "tests/d.py::x",
                     "tests/c.py::x"]


def test_files_expected_to_take_the_same_time_keep_their_collected_order() -> None:
    nodeids = ["tests/z.py::t", "tests/y.py::t", "tests/x.py::t"]
    assert slowest_files_first(nodeids, {}) == nodeids  # each one test at UNKNOWN_TEST_SECONDS
    assert UNKNOWN_TEST_SECONDS > 0


def test_recorded_seconds_merge_into_the_file(tmp_path: Path) -> None:
    path = tmp_path / "seconds.json"
    path.write_text(json.dumps({"tests/old.py": 12.0, "tests/a.py": 1.0}))
    seconds = FileSeconds()
    for nodeid, duration in (("tests/a.py::x", 0.25), ("tests/a.py::x", 3.0), ("tests/b.py::y[2]", 0.04)):
        seconds.add(nodeid, duration)  # setup and call of a.py::x both count
    seconds.write(path)
    assert load_seconds(path) == {"tests/a.py": 3.2, "tests/b.py": 0.0, "tests/old.py": 12.0}


def test_a_malformed_seconds_file_says_how_to_regenerate_it(tmp_path: Path) -> None:
    path = tmp_path / "seconds.json"
    path.write_text(json.dumps({"tests/a.py": "slow"}))
    with pytest.raises(ValueError, match="AGENTEVOLVER_TEST_SECONDS_OUT"):
        load_seconds(path)


def test_the_committed_seconds_name_files_that_exist() -> None:
    seconds = load_seconds(SECONDS_FILE)
    assert seconds, "tests/file_seconds.json is empty"
    missing = [name for name in seconds if not (REPO / name).is_file()]
    assert not missing, f"tests/file_seconds.json names files that are gone: {missing}; regenerate it ({__doc__})"


def test_the_real_collection_puts_a_measured_slow_file_first() -> None:
    """Through pytest itself: the conftest's hook reorders what the command line names in another order."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_file_order.py", "tests/test_main_ppo.py"],
        cwd=REPO, capture_output=True, text=True,  # a recording outer run's output file is not this run's
        env={k: v for k, v in os.environ.items() if k != "AGENTEVOLVER_TEST_SECONDS_OUT"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert collected[0].startswith("tests/test_main_ppo.py::"), collected
    assert collected[-1].startswith("tests/test_file_order.py::"), collected


def test_a_run_under_xdist_records_each_files_seconds(tmp_path: Path) -> None:
    """``AGENTEVOLVER_TEST_SECONDS_OUT`` on a run with two xdist workers: the controller writes every file."""
    out = tmp_path / "seconds.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "tests/test_file_order.py", "tests/test_config_defaults.py", "-k", "not real_collection and not xdist"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "AGENTEVOLVER_TEST_SECONDS_OUT": str(out)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    recorded = load_seconds(out)
    assert set(recorded) == {"tests/test_file_order.py", "tests/test_config_defaults.py"}, recorded
    assert all(value >= 0 for value in recorded.values())
