"""A real memory service subprocess (``python -m agentevolver.memory_service``) for tests, on a free port."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from ports import free_port

from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings

REPO_ROOT = Path(__file__).resolve().parent.parent



class Service:
    """A real service subprocess on a fixed data folder, which a test may kill and start again."""

    def __init__(self, data_dir: Path, log_path: Path, *extra: str) -> None:
        self.data_dir, self.log_path, self.extra = data_dir, log_path, extra
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> Service:
        """Launch; return once /healthz answers OK."""
        port = free_port()
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agentevolver.memory_service", "--port", str(port), "--data-dir",
                 str(self.data_dir), "--log-level", "warning", *self.extra],
                cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # a readiness deadline (model load on a busy machine), not a test limit
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"memory service exited with {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=2).text == "OK":
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"memory service not ready:\n{self.log()}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, so whatever survives was on disk."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self) -> MemoryClient:
        return MemoryClient(MemoryClientSettings(base_url=self.url, timeout_s=120, backoff_initial_s=0.05,
                                                 backoff_max_s=0.2))

    def post(self, route: str, body: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{route}", json=body, timeout=120)


@contextlib.contextmanager
def memory_service(data_dir: Path, log_path: Path, *extra: str) -> Iterator[Service]:
    running = Service(data_dir, log_path, *extra)
    try:
        yield running.start()
    finally:
        running.stop()


def task_summariser(body: dict[str, Any]) -> str:
    """A scripted ``exp_summarizer`` LLM for training tests: one experience per task ("Task tN: ..." as the
    test environments word their tasks), marked ``EXP-tN`` so a test can find it in prompts; validation
    scores every candidate 0.9."""
    import json
    import re

    from agentevolver.memory_service import prompts

    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system == prompts.VALIDATION_SYSTEM:
        return '{"score": 0.9, "reason": "useful"}'
    match = re.search(r"Task (t\d+)", user)
    task = match.group(1) if match else "unknown"
    experience = [{"when_to_use": f"Task {task}: say something.", "experience": f"EXP-{task}: keep it short."}]
    return "```json\n" + json.dumps(experience) + "\n```"
