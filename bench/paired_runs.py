"""What the paired-run benches share: the machine line, a calc environment service, and the alternating rounds.

A paired-run bench (``bench/lora_quickstart.py``, ``bench/async_trainer.py``) trains the quickstart once per arm and
round through ``python -m agentevolver.main_ppo``, on one environment service, alternating the arms' order between
rounds so that a change of load does not always hit the same arm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


def load() -> str:
    """The 1, 5 and 15-minute load averages, as ``uptime`` shows them."""
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def start_env_service(log: Path, env: str = "calc") -> tuple[subprocess.Popen[bytes], str]:
    """An environment service (calc by default) on a free port; returns it once ``/healthz`` answers."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(ROOT / "env_service" / "env_service.py"), "--env", env,
                                "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"env service exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("env service not ready after 300 s")


def run_rounds(arms: list[str], rounds: int, run_arm: Callable[[str, str, Path], dict[str, Any]],
               describe: Callable[[dict[str, Any]], str], out: Path | None, prefix: str) -> list[dict[str, Any]]:
    """``rounds`` rounds of every arm (``run_arm(arm, env_url, round_folder)``), the order reversed every other
    round, on one calc service in a scratch folder; every result gets its ``round``, is printed with
    ``describe`` and the load, and all so far go to ``out`` (JSON) after each run, so a bench stopped half-way
    keeps what it measured."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        folder = Path(tmp)
        service, url = start_env_service(folder / "env_service.log")
        try:
            for round_ in range(rounds):
                for arm in arms if round_ % 2 == 0 else arms[::-1]:
                    result = {**run_arm(arm, url, folder / f"round{round_}"), "round": round_}
                    results.append(result)
                    if out:
                        out.write_text(json.dumps(results, indent=2))
                    print(f"round {round_} {arm}: {describe(result)}, load {load()}", flush=True)
        finally:
            service.terminate()
            service.wait()
    return results
