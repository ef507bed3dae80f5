"""Start child processes in sessions of their own, and stop exactly those again.

Why sessions: each child the launcher starts becomes the leader of a new session (and process group), so
a Ctrl-C in the launcher's terminal reaches only the launcher, which then stops its children in a chosen
order (training first, then the services it talks to). Stopping targets the process groups of that
session by their ids, never processes found by name: the reference launcher's "kill everything whose
command line says python or ray" also killed other users' jobs.

Why more than ``killpg`` of the leader's group: Ray puts every worker in a process group of its own (same
session), and a process may leave the session altogether (``setsid``). So a unit's members are all
processes whose session id is the leader's pid (Linux never hands out a pid while it is still some
session's or group's id, so this is exact), and every child also carries ``AGENTEVOLVER_LAUNCH_ID`` in
its environment: after the units are stopped, a last sweep stops any process that still carries this
launch's id, wherever it moved.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

__all__ = [
    "LAUNCH_ID_ENV",
    "Unit",
    "exit_status",
    "launched_processes",
    "session_members",
    "start_unit",
    "stop_units",
    "sweep_launch",
]

#: Environment variable every started process (and, by inheritance, its descendants) carries.
LAUNCH_ID_ENV = "AGENTEVOLVER_LAUNCH_ID"

_POLL_S = 0.1


@dataclass
class Unit:
    """One started command: the leader process of its own session."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        """Leader pid, which is also the session id and the leader's process-group id."""
        return self.process.pid


def start_unit(name: str, argv: Sequence[str], *, env: Mapping[str, str], launch_id: str,
               log_path: Path | None = None, cwd: Path | None = None, append: bool = False) -> Unit:
    """Start ``argv`` as the leader of a new session; output to ``log_path`` (or inherited when None).

    stdin is /dev/null: a child in another session cannot read the terminal anyway, and one that tried
    would stop the launch instead of failing. ``append`` keeps what the log holds (a restarted service's
    log keeps the last words of the run that died).
    """
    child_env = {**env, LAUNCH_ID_ENV: launch_id}
    log: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab" if append else "wb")  # noqa: SIM115 - the child owns the descriptor after Popen
    try:
        process = subprocess.Popen(
            list(argv), env=child_env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT if log is not None else None, start_new_session=True,
        )
    finally:
        if log is not None:
            log.close()
    return Unit(name, process, log_path)


def session_members(sid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of session ``sid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
            continue
    return members


def launched_processes(launch_id: str) -> list[psutil.Process]:
    """Live processes that carry ``AGENTEVOLVER_LAUNCH_ID=launch_id`` (the launcher itself never does)."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(LAUNCH_ID_ENV) == launch_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _signal_groups(members: Iterable[psutil.Process], sig: int) -> None:
    groups = set()
    for proc in members:
        with contextlib.suppress(OSError, psutil.Error):
            groups.add(os.getpgid(proc.pid))
    for pgid in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _reap(units: Iterable[Unit]) -> None:
    for unit in units:
        unit.process.poll()


def _alive(units: Sequence[Unit]) -> dict[int, list[psutil.Process]]:
    _reap(units)
    return {unit.pid: members for unit in units if (members := session_members(unit.pid))}


def stop_units(units: Sequence[Unit], first_signal: int, grace_s: float, *,
               hurry: Callable[[], bool] = lambda: False) -> list[str]:
    """Stop every process of ``units`` (their sessions' process groups, by id): ``first_signal``, wait up to
    ``grace_s`` (or until ``hurry()`` says so, e.g. a second Ctrl-C), then SIGKILL and wait for them to go.
    Returns the names of the units that had to be killed.

    Units that already exited are still swept: their sessions may hold orphans (Ray workers, say).
    """
    alive = _alive(units)
    for members in alive.values():
        _signal_groups(members, first_signal)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline and not hurry():
        time.sleep(_POLL_S)
        alive = _alive(units)
    killed = [unit.name for unit in units if unit.pid in alive]
    kill_deadline = time.monotonic() + 30.0  # SIGKILL cannot be ignored; this only bounds a kernel hang
    while alive and time.monotonic() < kill_deadline:
        for members in alive.values():
            _signal_groups(members, signal.SIGKILL)
            for proc in members:  # a member may have moved to a group of its own after the listing
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        time.sleep(_POLL_S)
        alive = _alive(units)
    for unit in units:
        with contextlib.suppress(subprocess.TimeoutExpired):
            unit.process.wait(timeout=5)
    return killed


def sweep_launch(launch_id: str, grace_s: float) -> list[int]:
    """Stop processes that still carry this launch's id after their units were stopped (they left their
    session); returns their pids. SIGTERM, up to ``grace_s``, then SIGKILL."""
    stray = launched_processes(launch_id)
    for proc in stray:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _gone, left = psutil.wait_procs(stray, timeout=grace_s)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(left, timeout=10)
    return [proc.pid for proc in stray]


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode
