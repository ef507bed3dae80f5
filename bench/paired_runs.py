"""What the paired-run benches share: the machine line, a calc environment service, and the alternating rounds.

A paired-run bench (``bench/lora_quickstart.py``, ``bench/async_trainer.py``) trains the quickstart once per arm and
round through ``python -m agentevolver.main_ppo``, on one environment service, alternating the arms' order between
rounds so that a change of load does not always hit the same arm.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
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


def quickstart_command(config_name: str, url: str, run_dir: Path, steps: int, *extra: str,
                       save_freq: int = -1, small: bool = False) -> list[str]:
    """``python -m agentevolver.main_ppo`` on ``config_name`` for ``steps`` steps: validation off, metrics to
    ``run_dir/metrics.jsonl``; ``small`` shrinks it to tiny-test (a smoke run of the bench)."""
    command = [
        sys.executable, "-m", "agentevolver.main_ppo", "--config-name", config_name, f"env_service.env_url={url}",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        f"trainer.save_freq={save_freq}", f"trainer.default_local_dir={run_dir}", "trainer.logger=[jsonl]",
        f"trainer.experiment_name=bench_{run_dir.name}", "+ray_kwargs.ray_init.include_dashboard=false", *extra,
    ]
    if small:
        command += ["actor_rollout_ref.model.path=tiny-test", "agent_flow.max_tokens_per_turn=16"]
    return command


def run_logged(command: list[str], folder: Path, name: str,
               watch: Callable[[int], AbstractContextManager[Any]] | None = None) -> tuple[float, Any]:
    """Run ``command`` in ``folder`` with its output in ``<name>.log``, ``watch(pid)`` around it; returns the
    seconds it took and what ``watch`` gave. A failed run raises with the end of its log."""
    started = time.monotonic()
    log = folder / f"{name}.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
        with (watch(process.pid) if watch else contextlib.nullcontext()) as watched:
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{name} run failed ({process.returncode}):\n{log.read_text()[-4000:]}")
    return time.monotonic() - started, watched


def median_of(steps: dict[int, dict[str, float]], key: str, which: Sequence[int]) -> float:
    """The median of ``key`` over the steps ``which`` that logged it (nan when none did)."""
    values = [steps[s][key] for s in which if steps[s].get(key) is not None]
    return statistics.median(values) if values else float("nan")


def ratio_table(results: list[dict[str, Any]], rows: Sequence[tuple[str, Callable[[dict[str, Any]], float]]],
                base: str, other: str, header: tuple[str, str]) -> str:
    """A markdown table: each row's median over the rounds for the arms ``base`` and ``other``, and other / base
    (``-`` where either is nan or base is 0)."""
    lines = [f"| | {header[0]} | {header[1]} | {header[1]} / {header[0]} |", "|---|---|---|---|"]
    for label, value in rows:
        first = statistics.median(value(r) for r in results if r["arm"] == base)
        second = statistics.median(value(r) for r in results if r["arm"] == other)
        ratio = f"{second / first:.2f}x" if first and first == first and second == second else "-"
        lines.append(f"| {label} | {first:.2f} | {second:.2f} | {ratio} |")
    return "\n".join(lines)
