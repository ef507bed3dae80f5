"""Start the real environment service (``python env_service/env_service.py``) on a free port for a test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent



@dataclass
class RunningService:
    url: str
    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def env_service(envs: str, *extra: str, tmp_path: Path, env: dict[str, str] | None = None,
                ready_deadline_s: float = 180.0) -> Iterator[RunningService]:
    """Run the service as a subprocess; yield once ``/healthz`` answers; stop it (SIGTERM) afterwards."""
    port = free_port()
    log_path = tmp_path / f"env_service_{port}.log"
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
                 **(env or {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO_ROOT / "env_service" / "env_service.py"), "--env", envs, "--port", str(port),
             "--plugin", "envs_for_tests", "--log-level", "warning", *extra],
            cwd=REPO_ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_deadline_s  # a readiness deadline, not a test time limit
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"env service exited with {process.returncode}:\n{log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).text == "OK":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"env service not ready after {ready_deadline_s} s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield RunningService(url, process, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.asynccontextmanager
async def quick_env_client(url: str) -> AsyncIterator[Any]:
    """An env client for episode tests: one retry with short back-offs, so a test of a failure does not wait
    through the production retry schedule; closed afterwards."""
    from agentevolver.client.env_client import EnvClient, EnvClientSettings

    client = EnvClient(EnvClientSettings(env_url=url, max_retries=1, backoff_initial_s=0.05, backoff_max_s=0.1))
    try:
        yield client
    finally:
        await client.aclose()
