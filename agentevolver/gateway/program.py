"""Running the user's agent program once per episode: a Python callable, or a command.

A **callable** (``agent_program.callable``: ``package.module:function`` or ``path/to/agent.py:function``) is called with the episode's
:class:`~agentevolver.schema.gateway_wire.ProgramTask`; it may be ``async def`` (run on the episodes' event
loop, cancelled at the time limit) or a plain function (run in a thread of its own, so a blocking OpenAI
client does not stop the loop that serves its calls). A thread cannot be killed: at the time limit the
episode is closed, so the program's next call gets a 409 and its answer is ignored.

A **command** (``agent_program.command``) runs as a child process in a session of its own, killed with its
children at the time limit. It gets the task as JSON in ``AGENTEVOLVER_TASK`` and the endpoint in
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (so an unchanged OpenAI-SDK program talks to the gateway), and
reports its reward to ``AGENTEVOLVER_REWARD_URL`` or as its last line of output (a number, or a JSON
object with ``reward``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentevolver.config.agent_program import AgentProgramConfig
from agentevolver.errors import ConfigError
from agentevolver.schema.gateway_wire import ProgramTask

__all__ = ["AgentProgram", "ProgramRun", "load_callable", "resolve_program_paths"]

#: Threads for plain-function programs: they wait on HTTP, so one per concurrent episode is cheap, and a
#: small pool would queue episodes behind each other inside their time limit.
_THREADS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="agent-program")
#: How much of a command's output is kept for the record when it fails (characters).
_OUTPUT_TAIL = 2000

Fault = Literal["raised", "timeout", "exit_status"]


@dataclass
class ProgramRun:
    """What one run of the program gave: its value (a callable's return, a command's last line parsed), or
    the fault that ended it and a message saying what happened."""

    value: Any = None
    fault: Fault | None = None
    error: str | None = None
    seconds: float = 0.0


def load_callable(target: str) -> Callable[..., Any]:
    """``package.module:function`` or ``path/to/file.py:function`` (the name may be dotted:
    ``module:Class.method``); errors name the key and what to change."""
    module_name, _, attribute = target.partition(":")
    if module_name.endswith(".py"):
        obj: Any = _module_from_file(Path(module_name))
    else:
        try:
            obj = importlib.import_module(module_name)
        except ImportError as err:
            raise ConfigError(f"agent_program.callable: cannot import {module_name!r} ({err}); give an importable "
                              "module or a file, e.g. 'examples/agent_program/calc_agent.py:run'") from err
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"agent_program.callable: {module_name!r} has no {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"agent_program.callable: {target!r} is a {type(obj).__name__}, not a function")
    return obj


def _module_from_file(path: Path) -> Any:
    """A program given as a file: loaded once per process under a name derived from its absolute path."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"agent_program.callable: no file {path}; give the program's .py file (relative paths "
                          "are taken from the directory the run was started in)")
    name = "agentevolver_program_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"agent_program.callable: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ConfigError(f"agent_program.callable: importing {path} failed: {type(err).__name__}: {err}") from err
    return module


class AgentProgram:
    """The configured program (see the module docstring); shared by every episode, holds no episode state."""

    def __init__(self, config: AgentProgramConfig) -> None:
        if not config.enabled:
            raise ConfigError("agent_program: set agent_program.callable or agent_program.command")
        self.config = config
        self.function = load_callable(config.callable) if config.callable is not None else None

    async def run(self, task: ProgramTask) -> ProgramRun:
        started = time.perf_counter()
        if self.function is not None:
            run = await self._call(task)
        else:
            run = await self._command(task)
        run.seconds = time.perf_counter() - started
        return run

    async def _call(self, task: ProgramTask) -> ProgramRun:
        function = self.function
        assert function is not None
        if inspect.iscoroutinefunction(function):
            work: Any = function(task)
        else:
            work = asyncio.get_running_loop().run_in_executor(_THREADS, function, task)
        try:
            return ProgramRun(value=await asyncio.wait_for(work, self.config.timeout_s))
        except TimeoutError:
            return ProgramRun(fault="timeout", error=f"the program ran past agent_program.timeout_s "
                                                     f"({self.config.timeout_s:g} s)")
        except Exception as err:  # the user's code: any exception is its episode's fault, not the run's
            return ProgramRun(fault="raised", error=f"the program raised {type(err).__name__}: {err}")

    async def _command(self, task: ProgramTask) -> ProgramRun:
        argv = list(self.config.command or [])
        env = {**os.environ, "AGENTEVOLVER_TASK": task.model_dump_json(), "AGENTEVOLVER_BASE_URL": task.base_url,
               "AGENTEVOLVER_MODEL": task.model, "AGENTEVOLVER_REWARD_URL": task.reward_url,
               "OPENAI_BASE_URL": task.base_url, "OPENAI_API_KEY": task.api_key}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as err:
            return ProgramRun(fault="raised", error=f"agent_program.command {argv[0]!r} could not start: {err}")
        try:
            output, _ = await asyncio.wait_for(process.communicate(), self.config.timeout_s)
        except TimeoutError:
            _kill_session(process.pid)
            await process.wait()
            return ProgramRun(fault="timeout", error=f"the command ran past agent_program.timeout_s "
                                                     f"({self.config.timeout_s:g} s) and was killed")
        finally:
            if process.returncode is None:
                _kill_session(process.pid)
        text = output.decode("utf-8", errors="replace")
        if process.returncode != 0:
            return ProgramRun(fault="exit_status", error=f"the command exited with status {process.returncode}; "
                                                         f"its output ends: {text[-_OUTPUT_TAIL:]}")
        return ProgramRun(value=_last_line_value(text))


def _kill_session(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _last_line_value(text: str) -> Any:
    """A command's reward printed as its last line: a number or a JSON object; None when it printed neither."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, int | float | dict) and not isinstance(value, bool) else None


def resolve_program_paths(callable_target: str | None) -> str | None:
    """The callable with a file path made absolute (on the driver: the workers that load it may run in
    another working directory); loads it once there, so a wrong name fails before Ray starts."""
    if callable_target is None:
        return None
    module_name, _, attribute = callable_target.partition(":")
    if module_name.endswith(".py"):
        callable_target = f"{Path(module_name).expanduser().resolve()}:{attribute}"
    load_callable(callable_target)
    return callable_target
