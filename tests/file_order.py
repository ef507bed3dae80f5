"""Test files in the order that finishes the suite soonest on xdist workers: the slowest first.

Why: the suite runs with ``--dist loadfile`` (each file on one worker, so a file's module-scoped services start
once), and xdist's default order of files is by their number of tests, most first. The files that start training
runs hold a few slow tests each, so they came last, where one can run while the other worker has nothing left.
Handing out the slowest files first (longest-processing-time first) leaves only short files for the end. Measured
on the 2-core CI machine (docs/benchmarks.md): the suite now ends within 30 s of an even split of its test time;
replayed over the same seconds, the old order wasted about 20-40 s, so the gain is small. pytest-xdist has no order by duration, and pytest-split shards a suite over
separate jobs rather than ordering one xdist run, so this is the few lines it takes.

Seconds per file live in :data:`SECONDS_FILE`, measured from a whole run (the test time of every phase,
setup and teardown included). Refresh them from a run of the default suite::

    AGENTEVOLVER_TEST_SECONDS_OUT=tests/file_seconds.json bash scripts/test.sh

A file missing from it (a new one) counts :data:`UNKNOWN_TEST_SECONDS` per test, so it keeps its place among
the quick files until the next refresh.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

#: Measured seconds per test file (relative path from the repository root, as in a test's node id).
SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
#: Seconds assumed per test of a file without a measurement: most unit tests take well under one.
UNKNOWN_TEST_SECONDS = 1.0


def file_of(nodeid: str) -> str:
    """``tests/test_x.py::test_y[z]`` -> ``tests/test_x.py``: the unit xdist's ``loadfile`` hands a worker."""
    return nodeid.split("::", 1)[0]


def load_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The measured seconds per file; an absent file measures nothing (every file then counts per test)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, int | float) for v in data.values()):
        raise ValueError(f"{path}: expected a JSON object of test file -> seconds; regenerate it with "
                         "AGENTEVOLVER_TEST_SECONDS_OUT=tests/file_seconds.json bash scripts/test.sh")
    return {str(k): float(v) for k, v in data.items()}


def slowest_files_first(nodeids: Iterable[str], seconds: dict[str, float]) -> list[str]:
    """Node ids regrouped by file, the files by their expected seconds, most first; each file's tests keep their
    order, and files that expect the same time keep the order they were collected in."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for nodeid in nodeids:
        by_file[file_of(nodeid)].append(nodeid)

    def expected(name: str) -> float:
        return seconds.get(name, UNKNOWN_TEST_SECONDS * len(by_file[name]))

    ordered = sorted(by_file, key=expected, reverse=True)  # sorted is stable: ties keep collection order
    return [nodeid for name in ordered for nodeid in by_file[name]]


class FileSeconds:
    """Sums each file's test time (setup, call and teardown of every test) from the run's reports; under xdist
    the controller receives every worker's reports, so one instance there sees the whole suite."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, nodeid: str, duration: float) -> None:
        self.seconds[file_of(nodeid)] += duration

    def write(self, path: Path) -> None:
        """Merge into ``path`` (files this run did not measure keep their earlier seconds), sorted by name."""
        merged = load_seconds(path)
        merged.update({name: round(value, 1) for name, value in self.seconds.items()})
        path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
