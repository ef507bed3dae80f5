"""tests/shared_ray.py and training_fixture.run_training: a run that fails because this process's shared Ray cluster
went bad (Ray cancelled its first actor before it started) retires the cluster, its logs kept beside the run, and
runs once more on a fresh cluster; any other failure is returned as it is, with no second run.

The "run" here is a small program in place of a training command (the fixture's edge): it reports the cluster it
was pointed at and fails the first time with Ray's words or with its own. The cluster is real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import shared_ray
from training_fixture import run_training

pytestmark = pytest.mark.skipif(not shared_ray.enabled(), reason="AGENTEVOLVER_TEST_SHARED_RAY=0: no shared cluster")

RUN = '''
import os, sys
from pathlib import Path
calls = Path("calls")
seen = calls.read_text() if calls.exists() else ""
calls.write_text(seen + os.environ["RAY_ADDRESS"] + "\\n")
if not seen:
    print(sys.argv[1], file=sys.stderr)
    sys.exit(1)
'''


def _calls(run_dir: Path) -> list[str]:
    return (run_dir / "calls").read_text().split()


def test_a_run_the_cluster_failed_runs_again_on_a_fresh_one_with_the_old_logs_kept(tmp_path: Path) -> None:
    before = shared_ray.address()
    with pytest.warns(UserWarning, match="shared Ray cluster went bad"):
        done = run_training([sys.executable, "-c", RUN, f"ActorDiedError ... {shared_ray.BROKEN_SIGNS[0]}"], tmp_path)
    assert done.returncode == 0, done.stderr
    first, second = _calls(tmp_path)
    assert first == before and second != before  # the rerun joined a cluster started after the first one stopped
    assert second == shared_ray.address()
    assert (tmp_path / "retired_ray_cluster_logs" / "gcs_server.out").is_file()


def test_any_other_failure_is_the_runs_own_and_runs_once(tmp_path: Path) -> None:
    before = shared_ray.address()
    done = run_training([sys.executable, "-c", RUN, "ValueError: the run's own fault"], tmp_path)
    assert done.returncode == 1 and "the run's own fault" in done.stderr
    assert _calls(tmp_path) == [before] and shared_ray.address() == before
    assert not (tmp_path / "retired_ray_cluster_logs").exists()
