"""``python -m agentevolver.experiments.hold --config-path RECORD ...``: the "training" of the services launch.

The ablation starts its shared services with the launcher (``--target agentevolver.experiments.hold``), so
they get the launcher's readiness checks, logs, record and shutdown. The launcher runs this module only
once every service answers its health URL; it then writes ``<record>/services_ready`` and waits until the
launcher stops it (SIGINT/SIGTERM when the ablation ends) or until the ablation's process (pid in
``$AGENTEVOLVER_ABLATION_PID``) is gone, e.g. killed with SIGKILL; either way the launcher then stops the
services it started.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import psutil

__all__ = ["PARENT_ENV", "READY_FILE", "main"]

#: Environment variable with the pid of the ablation process the services are held for.
PARENT_ENV = "AGENTEVOLVER_ABLATION_PID"
#: Written into the launcher record folder once the services are up.
READY_FILE = "services_ready"

_POLL_S = 1.0


def main(argv: list[str]) -> int:
    if "--config-path" not in argv:
        print("usage: python -m agentevolver.experiments.hold --config-path RECORD_FOLDER [...]", file=sys.stderr)
        return 2
    record = Path(argv[argv.index("--config-path") + 1])
    stop: list[int] = []

    def handle(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    signal.signal(signal.SIGINT, handle)
    signal.signal(signal.SIGTERM, handle)
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    (record / READY_FILE).write_text(json.dumps({"pid": os.getpid(), "parent": parent}))
    while not stop:
        if parent and not psutil.pid_exists(parent):
            print(f"the ablation (pid {parent}) is gone: releasing the services", file=sys.stderr)
            return 0
        time.sleep(_POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
