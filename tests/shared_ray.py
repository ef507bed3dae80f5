"""One Ray cluster per pytest process, which the training runs it starts join instead of starting their own.

Why: a training run that starts its own local Ray pays Ray's start (GCS, raylet, agents) before its first step
and Ray's stop after its last: 8.6 s of a 30 s tiny-test run, measured with ``bench/startup_profile.py --arm
"joined=+ray_kwargs.ray_init.address=..."`` (AMD EPYC with AVX512-BF16, idle; docs/benchmarks.md). The suite
starts about 36 runs. Joining a running cluster is a path users take too (several nodes, docs/backends.md):
``RAY_ADDRESS`` makes ``ray.init`` join, and ``agentevolver.main_ppo`` leaves out the preset's local Ray sizes.

What the runs do not share: each driver is its own Ray job, and its actors (the FSDP worker, the rollout server)
die with it, so a run starts from fresh worker processes as before. Tests about a local Ray's own processes or
``ray.init``'s arguments (the allocator in Ray's daemons, the multi-node cluster, ``ray.init`` in the test's
process) do not use it: only :func:`training_fixture.training_env` passes the address on.

A cluster can go bad while its processes live on: in two clean-clone CI runs on the 2-core machine (2026-12-07, once
beside a third process tree, once beside setup work), every run one pytest worker started from some point on
failed the same way: verl's first actor "never ran - it was cancelled before it started running" (six runs in a
row, four minutes), while the other worker's cluster served the same tests. Not reproduced alone. So a run that
fails with Ray's words for it (:data:`BROKEN_SIGNS`) retires the cluster (:func:`retire`: its logs kept beside the
run for a diagnosis, the cluster stopped) and runs again once on a fresh one (:func:`training_fixture.run_training`).

The cluster is started on first use (a pytest process that runs no training run starts none) with the CPU preset's
local sizes and system config, in a Ray temp folder of its own, and stopped when the session ends
(``conftest.py``). A cluster found dead (a test that killed Ray's processes) is started again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The CPU preset's local Ray (config/backend/cpu.yaml, ``ray_kwargs.ray_init``): 8 logical CPU slots, and no
#: idle workers started ahead of need. GPU slots: the preset declares ``trainer.n_gpus_per_node`` (1 in every
#: test that joins); 2 leave room for a test with two ranks.
HEAD_ARGS: dict[str, Any] = {
    "num_cpus": 8,
    "num_gpus": 2,
    "include_dashboard": False,
    "_system_config": {"enable_worker_prestart": False, "prestart_worker_first_driver": False},
}

#: What a run prints when its actors were cancelled before they started on a cluster gone bad: Ray's own words
#: (``ray.exceptions.ActorDiedError``), not the product's, so nothing of the run under test had started.
BROKEN_SIGNS = ("The actor never ran - it was cancelled before it started running",)
#: Log files larger than this are left out of a retired cluster's kept logs (a worker's log can be large).
KEPT_LOG_BYTES = 4 * 2**20

#: Set ``AGENTEVOLVER_TEST_SHARED_RAY=0`` to give every training run a local Ray of its own, as before.
SWITCH = "AGENTEVOLVER_TEST_SHARED_RAY"

_cluster: Any = None
_temp: str | None = None


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def address() -> str:
    """The running cluster's GCS address (host:port), started here if there is none or it died."""
    global _cluster, _temp
    if _cluster is not None and not _alive(_cluster):
        stop()
    if _cluster is None:
        from ray.cluster_utils import Cluster

        # Short (Ray's socket paths must stay under 108 bytes) and apart from /tmp/ray, where other Ray instances
        # keep their sessions. RAY_TMPDIR while it starts: Ray writes the head's address into
        # <RAY_TMPDIR>/ray/ray_current_cluster, and a plain ray.init() anywhere on the machine (a test's own local
        # Ray, a run with a Ray of its own) would join the cluster named there instead of starting one.
        _temp = tempfile.mkdtemp(prefix="aeray-", dir="/tmp")
        with _ray_tmpdir(_temp):
            _cluster = Cluster(initialize_head=True,
                               head_node_args={**HEAD_ARGS, "temp_dir": os.path.join(_temp, "ray")})
    return str(_cluster.address)


def went_bad(output: str) -> bool:
    """Whether a failed run's output shows the cluster's own failure (:data:`BROKEN_SIGNS`)."""
    return any(sign in output for sign in BROKEN_SIGNS)


def retire(keep_logs_in: Path) -> Path | None:
    """Copy the running cluster's logs (each file up to :data:`KEPT_LOG_BYTES`) into ``keep_logs_in`` and stop
    the cluster, so that the next :func:`address` starts a fresh one. Returns where the logs went (None: there was
    no cluster)."""
    if _cluster is None or _temp is None:
        return None
    logs = Path(_temp) / "ray" / "session_latest" / "logs"

    def too_big(folder: str, names: list[str]) -> list[str]:
        return [name for name in names
                if (Path(folder) / name).is_file() and (Path(folder) / name).stat().st_size > KEPT_LOG_BYTES]

    with contextlib.suppress(OSError):
        shutil.copytree(logs, keep_logs_in, ignore=too_big, dirs_exist_ok=True)
    stop()
    return keep_logs_in


def stop() -> None:
    """Stop the cluster (if one was started) and remove its temp folder."""
    global _cluster, _temp
    if _cluster is not None and _temp is not None:
        with contextlib.suppress(Exception), _ray_tmpdir(_temp):
            _cluster.shutdown()
    if _temp is not None:
        shutil.rmtree(_temp, ignore_errors=True)
    _cluster, _temp = None, None


@contextlib.contextmanager
def _ray_tmpdir(folder: str) -> Iterator[None]:
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = folder
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before


def _alive(cluster: Any) -> bool:
    try:
        return bool(cluster.head_node.remaining_processes_alive())
    except Exception:
        return False
