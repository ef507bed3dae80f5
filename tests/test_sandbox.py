"""The sandbox contains hostile code: each attack is stopped and reported, and this process is unharmed.

Hostile cases run in three modes so every line of defence is proven on its own:

* ``full``: the production setting (kernel layers + audit hook);
* ``os_only``: kernel layers only (namespaces, jail, own uid, rlimits) -- needs root with namespaces;
* ``audit_only``: no namespaces or jail (the fallback of an unprivileged service): the audit hook,
  rlimits and the scrubbed environment must hold by themselves.

No test asserts on elapsed time (the machine is shared); limits are small so the suite stays quick.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import ValidationError

from env_service.sandbox import SandboxLimits, SandboxResult, run_python
from env_service.sandbox import runner as sandbox_runner

REPO = Path(__file__).resolve().parents[1]
HOSTILE = SandboxLimits(cpu_seconds=1, wall_seconds=2.5)


def _kernel_layers_available() -> bool:
    return {"jail", "pidns", "uid"} <= set(run_python("pass").isolation)


KERNEL = _kernel_layers_available()
MODES = {
    "full": {},
    "os_only": {"audit": False},
    "audit_only": {"isolate": False},
}


@dataclass
class Tracked:
    """What one test's runs left behind: the supervisor pids (= process groups), uids and scratch dirs."""

    pgids: list[int] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)
    scratches: list[str] = field(default_factory=list)


@pytest.fixture
def tracked(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracked]:
    """Record every run's process group, uid and scratch dir; afterwards assert none of them survives."""
    seen = Tracked()
    real_popen, real_mkdtemp, real_uid = subprocess.Popen, tempfile.mkdtemp, sandbox_runner._allocate_uid

    class SpyPopen(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            seen.pgids.append(self.pid)

    def spy_mkdtemp(*args: object, **kwargs: object) -> str:
        path = real_mkdtemp(*args, **kwargs)
        seen.scratches.append(os.path.realpath(path))
        return path

    def spy_uid() -> int:
        uid = real_uid()
        seen.uids.append(uid)
        return uid

    monkeypatch.setattr(sandbox_runner.subprocess, "Popen", SpyPopen)
    monkeypatch.setattr(sandbox_runner.tempfile, "mkdtemp", spy_mkdtemp)
    monkeypatch.setattr(sandbox_runner, "_allocate_uid", spy_uid)
    yield seen
    assert seen.pgids, "the test ran nothing"
    _assert_nothing_left(seen)


def _live_processes() -> list[tuple[int, int, int]]:
    """(pid, pgid, real uid) of every process that is not a zombie."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
        out.append((int(entry), int(stat[2]), uid))
    return out


def _assert_nothing_left(seen: Tracked) -> None:
    """No process of a run's group or uid alive (polling briefly: SIGKILL delivery is asynchronous)."""
    for _ in range(100):
        left = [p for p in _live_processes() if p[1] in seen.pgids or p[2] in seen.uids]
        if not left:
            break
        time.sleep(0.05)
    assert not left, f"processes outlived their sandbox run: {left}"
    for scratch in seen.scratches:
        assert not os.path.exists(scratch), f"scratch dir {scratch} was not removed"


def _modes() -> list[pytest.param]:
    skip_os = pytest.mark.skipif(not KERNEL, reason="needs root with mount/PID/network namespaces")
    return [pytest.param(name, marks=[skip_os] if name == "os_only" else [], id=name) for name in MODES]


def _runner(mode: str) -> Callable[..., SandboxResult]:
    return functools.partial(run_python, **MODES[mode])


# ---------------------------------------------------------------------------------------------- normal code
def test_stdout_stdin_and_exit_code(tracked: Tracked) -> None:
    result = run_python("import sys\ndata = sys.stdin.read()\nprint(data.upper())\nsys.exit(3)", stdin="héllo")
    assert result.stdout == "HÉLLO\n"
    assert result.exit_code == 3
    assert result.killed_reason is None and not result.timed_out and not result.ok


def test_success_is_ok(tracked: Tracked) -> None:
    result = run_python("print(sum(range(10)))")
    assert result.ok and result.stdout == "45\n" and result.stderr == ""
    assert result.cpu_s is not None


def test_exception_shows_a_traceback_of_the_program(tracked: Tracked) -> None:
    result = run_python("def f():\n    raise ValueError('boom')\n\nf()\n")
    assert result.exit_code == 1
    assert 'File "main.py", line 2, in f' in result.stderr
    assert "raise ValueError('boom')" in result.stderr
    assert result.stderr.rstrip().endswith("ValueError: boom")
    assert "_bootstrap" not in result.stderr  # the sandbox's own frames are not shown


def test_syntax_error_is_reported(tracked: Tracked) -> None:
    result = run_python("def broken(:\n    pass\n")
    assert result.exit_code == 1
    assert "SyntaxError" in result.stderr


def test_threads_and_atexit_finish_before_exit(tracked: Tracked) -> None:
    code = ("import atexit, threading, time\natexit.register(lambda: print('atexit'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nprint('main')\n")
    assert run_python(code).stdout == "main\nthread\natexit\n"


def test_files_inside_the_scratch_dir_work(tracked: Tracked) -> None:
    code = ("import os, pathlib, tempfile\npathlib.Path('a.txt').write_text('x')\nos.mkdir('d')\n"
            "with tempfile.NamedTemporaryFile('w', delete=False) as fh:\n    fh.write('y')\n"
            "print(open('a.txt').read(), sorted(p for p in os.listdir('.') if not p.startswith('tmp')))\n")
    result = run_python(code)
    assert result.ok, result.stderr
    assert result.stdout == "x ['a.txt', 'd']\n"


def test_common_stdlib_modules_import(tracked: Tracked) -> None:
    modules = "json collections heapq re fractions decimal itertools math statistics datetime dataclasses " \
              "typing functools bisect string random sqlite3 zlib hashlib unicodedata array"
    result = run_python(f"import {', '.join(modules.split())}\nprint('ok')")
    assert result.stdout == "ok\n", result.stderr


def test_concurrent_runs_do_not_interfere(tracked: Tracked) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: run_python(f"print(input() * {i})", stdin="ab\n"), range(12)))
    assert [r.stdout for r in results] == [("ab" * i) + "\n" for i in range(12)]


def test_large_stdin_is_streamed(tracked: Tracked) -> None:
    result = run_python("import sys\nprint(len(sys.stdin.read()))", stdin="x" * 3_000_000)
    assert result.stdout == "3000000\n"


def test_no_file_descriptors_leak(tracked: Tracked) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for code in ("print(1)", "while True: pass", "print('y' * 10**8)"):
        run_python(code, limits=HOSTILE)
    assert len(os.listdir("/proc/self/fd")) == before


def test_limits_are_validated() -> None:
    with pytest.raises(ValidationError):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ValidationError):
        SandboxLimits(memory_bytes=1024)
    with pytest.raises(ValidationError):
        SandboxLimits(unknown=1)  # type: ignore[call-arg]


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel layers need root")
def test_all_layers_are_in_force_as_root(tracked: Tracked) -> None:
    layers = set(run_python("pass").isolation)
    assert {"netns", "mountns", "pidns", "jail", "uid", "rlimits", "audit"} <= layers


@pytest.mark.skipif(not KERNEL, reason="needs the jail")
def test_the_jail_holds_only_the_stdlib_and_the_scratch_dir(tracked: Tracked) -> None:
    result = run_python("import os\nprint(os.getcwd(), os.getuid() != 0, sorted(os.listdir('/')))", audit=False)
    cwd, unprivileged, listing = result.stdout.split(" ", 2)
    assert cwd == "/sandbox" and unprivileged == "True"
    for absent in ("tmp", "work", "home", "proc", "var", "bin"):
        assert f"'{absent}'" not in listing


# ---------------------------------------------------------------------------------------------- hostile code
@pytest.mark.parametrize("mode", _modes())
def test_busy_loop_is_stopped(mode: str, tracked: Tracked) -> None:
    result = _runner(mode)("while True:\n    pass\n", limits=HOSTILE)
    assert result.timed_out
    assert result.killed_reason in ("cpu", "wall")


@pytest.mark.parametrize("mode", _modes())
def test_sleeping_forever_is_stopped_by_the_wall_clock(mode: str, tracked: Tracked) -> None:
    result = _runner(mode)("import time\ntime.sleep(3600)\n", limits=HOSTILE)
    assert result.timed_out and result.killed_reason == "wall"


@pytest.mark.parametrize("mode", _modes())
def test_fork_bomb_is_contained(mode: str, tracked: Tracked) -> None:
    code = "import os\nwhile True:\n    os.fork()\n"
    result = _runner(mode)(code, limits=HOSTILE)
    assert result.exit_code != 0
    assert "Resource temporarily unavailable" in result.stderr or "sandbox: os.fork" in result.stderr


@pytest.mark.parametrize("mode", _modes())
def test_starting_a_process_is_contained(mode: str, tracked: Tracked) -> None:
    result = _runner(mode)("import subprocess\nprint(subprocess.run(['echo', 'escaped']).returncode)",
                           limits=HOSTILE)
    assert "escaped" not in result.stdout
    assert result.exit_code != 0


@pytest.mark.parametrize("mode", _modes())
def test_memory_bomb_is_stopped(mode: str, tracked: Tracked) -> None:
    # CPU and wall limits well above what filling the memory limit takes (the kernel's page zeroing counts as
    # CPU time, over 1 s on a loaded 2-core machine), so the memory limit is what stops it
    limits = SandboxLimits(cpu_seconds=10, wall_seconds=30)
    result = _runner(mode)("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n", limits=limits)
    assert result.killed_reason == "memory"
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize("mode", _modes())
def test_huge_output_is_cut_and_the_run_killed(mode: str, tracked: Tracked) -> None:
    result = _runner(mode)("import sys\nsys.stdout.write('y' * 100_000_000)\n", limits=HOSTILE)
    assert result.killed_reason == "output"
    assert result.stdout_truncated
    assert len(result.stdout) < HOSTILE.max_output_bytes + 200
    assert result.stdout.startswith("y" * 1000) and "output truncated" in result.stdout


@pytest.mark.parametrize("mode", _modes())
def test_writing_outside_the_scratch_dir_changes_nothing(mode: str, tracked: Tracked, tmp_path: Path) -> None:
    targets = [f"/tmp/pwned-{uuid.uuid4().hex}", str(REPO / f"pwned-{uuid.uuid4().hex}"),
               str(REPO / "env_service" / f"pwned-{uuid.uuid4().hex}")]
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    attempts = [f"open({t!r}, 'w').write('x')" for t in targets] + [
        f"os.remove({str(victim)!r})", f"os.rename({str(victim)!r}, {targets[0]!r})", f"os.chmod({str(victim)!r}, 0o777)"]
    code = "import os\n" + "".join(
        f"try:\n    {attempt}\n    print('done')\nexcept OSError as e:\n    print('blocked', type(e).__name__)\n"
        for attempt in attempts)
    try:
        result = _runner(mode)(code, limits=HOSTILE)
        assert result.stdout.count("blocked") == len(attempts), result.stdout + result.stderr
        for target in targets:
            assert not os.path.exists(target)
        assert victim.read_text() == "keep me" and victim.stat().st_mode & 0o777 != 0o777
    finally:
        for target in targets:
            Path(target).unlink(missing_ok=True)


@pytest.mark.parametrize("mode", _modes())
def test_service_environment_is_invisible(mode: str, tracked: Tracked, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEBOX_TEST_SECRET", "s3cr3t-token")
    code = (f"import os\nprint(sorted(os.environ))\n"
            f"try:\n    print(open('/proc/{os.getpid()}/environ').read())\nexcept OSError as e:\n"
            f"    print('blocked', type(e).__name__)\n")
    result = _runner(mode)(code, limits=HOSTILE)
    assert "s3cr3t" not in result.stdout + result.stderr
    assert "CODEBOX_TEST_SECRET" not in result.stdout
    assert "blocked" in result.stdout


@pytest.mark.parametrize("mode", _modes())
def test_network_connection_never_arrives(mode: str, tracked: Tracked) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).send(b'hi')\n"
                f"    print('connected')\nexcept OSError as e:\n    print('blocked', type(e).__name__)\n")
        result = _runner(mode)(code, limits=HOSTILE)
        assert result.stdout.startswith("blocked"), result.stdout + result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()


@pytest.mark.parametrize("mode", _modes())
def test_killing_the_parent_or_this_process_fails(mode: str, tracked: Tracked) -> None:
    me = os.getpid()
    code = (f"import os\nfor pid in (os.getppid(), {me}):\n    try:\n        os.kill(pid, 9)\n"
            f"        print('killed', pid)\n    except OSError as e:\n        print('blocked', type(e).__name__)\n")
    result = _runner(mode)(code, limits=HOSTILE)
    assert "killed" not in result.stdout
    assert result.stdout.count("blocked") == 2
    os.kill(me, 0)  # still here


@pytest.mark.parametrize("mode", _modes())
def test_escaping_the_process_group_leaves_nothing_behind(mode: str, tracked: Tracked) -> None:
    result = _runner(mode)("import os, time\nos.setsid()\nprint('detached', flush=True)\ntime.sleep(3600)\n",
                           limits=HOSTILE)
    assert result.killed_reason == "wall"
    # the tracked fixture asserts that no process of the run's group or uid is alive afterwards


@pytest.mark.parametrize("mode", _modes())
def test_scratch_dir_is_removed_in_every_outcome(mode: str, tracked: Tracked) -> None:
    run = _runner(mode)
    for code in ("open('f', 'w').write('x' * 1000)", "while True: pass", "raise SystemExit(4)"):
        run(code, limits=HOSTILE)
    assert len(tracked.scratches) == 3
    # the tracked fixture asserts that every scratch dir is gone


def test_the_audit_hook_survives_monkeypatching(tracked: Tracked) -> None:
    """Patching os.path / builtins must not fool the hook (it binds everything it uses up front)."""
    target = f"/tmp/pwned-{uuid.uuid4().hex}"
    code = (
        "import builtins, os, posixpath\n"
        "posixpath.normpath = os.path.normpath = lambda p: '/sandbox/x'\n"
        "os.path.realpath = os.path.abspath = lambda p: '/sandbox/x'\n"
        "builtins.isinstance = lambda *a: True\n"
        "class Shifty:\n"
        "    calls = 0\n"
        "    def __fspath__(self):\n"
        "        Shifty.calls += 1\n"
        f"        return {target!r} if Shifty.calls == 1 else 'inside.txt'\n"
        "for path in (" + repr(target) + ", Shifty()):\n"
        "    try:\n        open(path, 'w').write('x')\n        print('wrote')\n"
        "    except OSError as e:\n        print('blocked', type(e).__name__)\n"
    )
    result = run_python(code, limits=HOSTILE, isolate=False)  # the hook alone
    assert result.stdout.count("blocked") == 2, result.stdout + result.stderr
    assert not os.path.exists(target)


def test_the_audit_hook_survives_emptying_its_globals(tracked: Tracked) -> None:
    """A traceback leads to the hook's frame and its module globals; emptying those must change nothing."""
    target = f"/tmp/pwned-{uuid.uuid4().hex}"
    code = (
        "try:\n    open('/nope', 'w')\nexcept PermissionError as e:\n    tb = e.__traceback__\n"
        "    while tb.tb_next:\n        tb = tb.tb_next\n    g = tb.tb_frame.f_globals\n"
        "    for k, v in list(g.items()):\n"
        "        if isinstance(v, (frozenset, tuple)):\n            g[k] = type(v)()\n"
        "    print('emptied', sorted(k for k in g if k.isupper()))\n"
        f"try:\n    open({target!r}, 'w').write('x')\n    print('wrote')\n"
        "except PermissionError:\n    print('blocked')\n"
        "try:\n    import socket\n    socket.socket()\n    print('socket')\nexcept PermissionError:\n    print('blocked')\n"
    )
    result = run_python(code, limits=HOSTILE, isolate=False)
    assert "emptied ['DENIED_EVENTS'" in result.stdout, result.stdout + result.stderr
    assert result.stdout.count("blocked") == 2, result.stdout + result.stderr
    assert not os.path.exists(target)


def test_ctypes_and_heap_walking_are_refused(tracked: Tracked) -> None:
    statements = ["import ctypes", "import gc; gc.get_objects()",
                  "import _posixsubprocess; _posixsubprocess.fork_exec()",  # raises no audit event: replaced
                  "import sys; del sys.modules['_posixsubprocess']; import _posixsubprocess"]
    code = (f"for stmt in {statements!r}:\n"
            "    try:\n        exec(stmt)\n        print('allowed', stmt)\n"
            "    except PermissionError:\n        print('blocked')\n")
    result = run_python(code, limits=HOSTILE, isolate=False)
    assert result.stdout.count("blocked") == len(statements), result.stdout + result.stderr


def test_the_test_process_is_fine_afterwards() -> None:
    """After all of the above: threads, signals and subprocesses of this process still work."""
    assert threading.active_count() >= 1
    assert signal.getsignal(signal.SIGINT) is not None
    assert subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True).stdout == "2\n"
