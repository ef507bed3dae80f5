"""Carry out a :class:`~agentevolver.launcher.plan.LaunchPlan`: services up, training run, everything down.

Order of events: write the run record; for each selected service, reuse it when its health URL already
answers, else start it (all at once) and poll every health URL until its deadline; run the training
command from the recorded config, supervising the services this launch started (one that exits is started
again, at most ``launcher.max_restarts`` times, with a doubling back-off; each restart goes to the console and
to ``launch.json``'s ``restarts``); finally stop what this launch started (training first, then the
services), on success, failure or Ctrl-C alike. The exit status is the training run's; 3 when a service
could not be started, 128 + N when the launcher was stopped by signal N.

Signals only set a flag that the polling loops check, instead of raising inside whatever the launcher was
doing (half-started processes would be lost); a second Ctrl-C skips the grace period of the shutdown.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
import uuid
from dataclasses import dataclass

import httpx
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.text import Text

from agentevolver.backends.cpu.precision import describe as describe_precision
from agentevolver.config import AgentEvolverSettings
from agentevolver.errors import AgentEvolverError
from agentevolver.finished_run import finished_message
from agentevolver.launcher.plan import DEFAULT_TARGET, LaunchPlan
from agentevolver.launcher.processes import Unit, exit_status, start_unit, stop_units, sweep_launch
from agentevolver.launcher.record import RunRecord
from agentevolver.launcher.services import ServicePlan, is_local_host, port_in_use, probe, tail
from agentevolver.launcher.signals import Interrupted, SignalFlags

__all__ = ["SERVICE_FAILED", "LaunchError", "launch"]

#: Exit status when a service could not be started or did not become healthy.
SERVICE_FAILED = 3

#: Exit status when the run record cannot be written (same as a config error: nothing was started).
RECORD_FAILED = 2

_LOG_TAIL_LINES = 30


class LaunchError(AgentEvolverError):
    """A service could not be started or did not become healthy; the message says which and where."""


@dataclass
class _Supervision:
    """How one started service has fared while training runs."""

    restarts: int = 0
    #: monotonic time of the planned restart, while the service is down and one is planned
    restart_at: float | None = None
    #: started again, and not yet answering its health URL
    recovering_since: float | None = None
    gave_up: bool = False


class _Launch:
    def __init__(self, plan: LaunchPlan, settings: AgentEvolverSettings, console: Console,
                 signals: SignalFlags) -> None:
        self.plan = plan
        self.settings = settings
        self.launcher = settings.launcher
        self.console = console
        self.signals = signals
        self.launch_id = uuid.uuid4().hex
        self.record = RunRecord(plan.record_dir)
        self.services: list[tuple[ServicePlan, Unit]] = []
        self.service_env: dict[str, dict[str, str]] = {}
        self.supervision: dict[str, _Supervision] = {}
        self.restarts: list[dict[str, object]] = []
        self.reused: list[ServicePlan] = []
        self.training: Unit | None = None
        self.client = httpx.Client(timeout=self.launcher.probe_timeout_s)

    def say(self, message: str, *, warning: bool = False) -> None:
        say(self.console, message, "warning" if warning else None)

    # -- services -------------------------------------------------------------------------------------------
    def start_services(self) -> None:
        to_start: list[ServicePlan] = []
        for svc in self.plan.services:
            if probe(self.client, svc.health_url) is None:
                self.say(f"service {svc.name!r} already answers {svc.health_url}: reusing it (not started, "
                         "not stopped)")
                self.reused.append(svc)
                continue
            if not is_local_host(svc.host):
                raise LaunchError(f"service {svc.name!r}: {svc.url} is on another machine ({svc.host}) and does "
                                  f"not answer {svc.health_url}; the launcher starts services on this machine "
                                  f"only: start it there, or point launcher.services.{svc.name}.url at 127.0.0.1")
            if port_in_use(svc.host, svc.port):
                raise LaunchError(f"service {svc.name!r}: port {svc.port} on {svc.host} is taken by a program that "
                                  f"does not answer {svc.health_url}; stop that program or change the port in "
                                  f"launcher.services.{svc.name}.url (or the config key it comes from)")
            to_start.append(svc)
        # PYTHONUNBUFFERED: so a failing service's log shows its last words
        base_env = {**os.environ, **self.plan.process_env, "PYTHONUNBUFFERED": "1"}
        for svc in to_start:
            log_path = self.record.log_path(svc.log_file)
            self.service_env[svc.name] = {**base_env, **svc.env}
            self.supervision[svc.name] = _Supervision()
            try:
                unit = start_unit(svc.name, svc.argv, env=self.service_env[svc.name], launch_id=self.launch_id,
                                  log_path=log_path)
            except OSError as err:
                raise LaunchError(f"service {svc.name!r}: cannot run {svc.argv[0]!r}: {err.strerror or err} "
                                  f"(launcher.services.{svc.name}.command)") from err
            self.services.append((svc, unit))
            self.say(f"starting {svc.name!r} (pid {unit.pid}): {shlex.join(svc.argv)}  [log: {log_path}]")
        self.wait_ready()

    def wait_ready(self) -> None:
        started = time.monotonic()
        pending = list(self.services)
        while pending:
            self.signals.check()
            for svc, unit in list(pending):
                if unit.process.poll() is not None:
                    self.fail(svc, unit, f"exited with status {exit_status(unit.process.returncode)} before it "
                                         "became healthy")
                reason = probe(self.client, svc.health_url)
                if reason is None:
                    pending.remove((svc, unit))
                    self.say(f"service {svc.name!r} is healthy after {time.monotonic() - started:.1f} s "
                             f"({svc.health_url})")
                    continue
                if time.monotonic() - started > svc.ready_timeout_s:
                    self.fail(svc, unit, f"did not become healthy within {svc.ready_timeout_s:g} s "
                                         f"(launcher.services.{svc.name}.ready_timeout_s); last probe of "
                                         f"{svc.health_url}: {reason}")
            if pending:
                time.sleep(self.launcher.poll_interval_s)

    def fail(self, svc: ServicePlan, unit: Unit, what: str) -> None:
        log = unit.log_path
        lines = tail(log, _LOG_TAIL_LINES) if log is not None else ""
        shown = "\n".join(f"    {line}" for line in lines.splitlines()) or "    (the log is empty)"
        raise LaunchError(f"service {svc.name!r} {what}.\n  log: {log}\n  last lines of the log:\n{shown}")

    def check_training_needs(self) -> None:
        """The trainer cannot do anything without its environment service: say so now, not after its
        retries run out minutes into the run."""
        if self.plan.target != DEFAULT_TARGET or any(svc.name == "env" for svc in self.plan.services):
            return
        url = self.settings.env_service.env_url.rstrip("/") + "/healthz"
        reason = probe(self.client, url)
        if reason is not None:
            raise LaunchError(f"the training run needs the environment service at env_service.env_url "
                              f"({self.settings.env_service.env_url}), which does not answer {url} ({reason}); "
                              f"add --with-env to start it, or start it yourself")
        memory = self.settings.memory
        wants_memory = memory.enable_summarizer or memory.enable_context_generator
        if wants_memory and all(svc.name != "memory" for svc in self.plan.services):
            reason = probe(self.client, memory.base_url.rstrip("/") + "/healthz")
            if reason is not None:
                self.say(f"the memory service at memory.base_url ({memory.base_url}) does not answer "
                         f"({reason}); add --with-memory to start it", warning=True)

    # -- training -------------------------------------------------------------------------------------------
    def run_training(self) -> int:
        argv = self.plan.training_argv
        self.say(f"training: {shlex.join(argv)}")
        self.training = start_unit("training", argv, env={**os.environ, **self.plan.process_env},
                                   launch_id=self.launch_id)
        self.record.update(training={"argv": argv, "pid": self.training.pid})
        while True:
            self.signals.check()
            code = self.training.process.poll()
            if code is not None:
                return exit_status(code)
            for index in range(len(self.services)):
                self.supervise(index)
            time.sleep(self.launcher.poll_interval_s)

    def supervise(self, index: int) -> None:
        """One look at a started service while training runs: plan a restart when it has exited, carry out a
        planned one when its back-off is over, say when a restarted one answers its health URL again."""
        svc, unit = self.services[index]
        state = self.supervision[svc.name]
        now = time.monotonic()
        if state.recovering_since is not None and probe(self.client, svc.health_url) is None:
            took = now - state.recovering_since
            self.say(f"service {svc.name!r} is healthy again after {took:.1f} s ({svc.health_url})")
            state.recovering_since = None
            self.record_recovery(svc, took)
        if unit.process.poll() is None or state.gave_up:
            return
        if state.restart_at is None:
            status = exit_status(unit.process.returncode)
            if state.restarts >= self.launcher.max_restarts:
                state.gave_up = True
                self.say(f"service {svc.name!r} exited with status {status} while training runs and is not "
                         f"started again (launcher.max_restarts={self.launcher.max_restarts} reached); the run "
                         f"goes on without it, its episodes fail and are counted; log: {unit.log_path}",
                         warning=True)
                self.record_restart(svc, unit, status, restarted=False)
                return
            delay = self.launcher.restart_backoff_s * 2 ** state.restarts
            state.restart_at = now + delay
            self.say(f"service {svc.name!r} exited with status {status} while training runs; starting it again "
                     f"in {delay:g} s (restart {state.restarts + 1} of at most {self.launcher.max_restarts}); "
                     f"log: {unit.log_path}", warning=True)
            return
        if now < state.restart_at:
            return
        status = exit_status(unit.process.returncode)
        stop_units([unit], signal.SIGTERM, min(self.launcher.shutdown_grace_s, 5.0))  # orphans of its session
        try:
            new = start_unit(svc.name, svc.argv, env=self.service_env[svc.name], launch_id=self.launch_id,
                             log_path=unit.log_path, append=True)
        except OSError as err:
            state.gave_up = True
            self.say(f"service {svc.name!r} cannot be started again: {err.strerror or err}", warning=True)
            self.record_restart(svc, unit, status, restarted=False)
            return
        state.restarts += 1
        state.restart_at = None
        state.recovering_since = now
        self.services[index] = (svc, new)
        self.say(f"started {svc.name!r} again (pid {new.pid}); waiting for {svc.health_url}")
        self.record_restart(svc, unit, status, restarted=True, pid=new.pid)

    def record_recovery(self, svc: ServicePlan, took_s: float) -> None:
        """The service's last restart answered its health URL ``took_s`` after it was started: noted on that
        restart's line of ``launch.json`` as ``healthy_after_s`` (absent while it has not answered yet)."""
        for row in reversed(self.restarts):
            if row["service"] == svc.name:
                row["healthy_after_s"] = round(took_s, 1)
                break
        self.record.update(restarts=self.restarts)

    def record_restart(self, svc: ServicePlan, unit: Unit, status: int, *, restarted: bool,
                       pid: int | None = None) -> None:
        """One line of ``launch.json``'s ``restarts`` (and the service rows with their current pid)."""
        self.restarts.append({"service": svc.name, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                              "exit_status": status, "old_pid": unit.pid, "restarted": restarted, "pid": pid})
        self.record.update(restarts=self.restarts, services=self.service_records())

    # -- shutdown -------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.signals.shutting_down()
        grace = self.launcher.shutdown_grace_s
        if self.training is not None:
            if self.training.process.poll() is None:
                self.say(f"stopping training (pid {self.training.pid}); Ctrl-C again to kill at once")
            self.report_killed(stop_units([self.training], signal.SIGINT, grace, hurry=self.signals.hurry))
        units = [unit for _svc, unit in reversed(self.services)]
        if units:
            self.say("stopping " + ", ".join(f"{u.name!r} (pid {u.pid})" for u in units))
            self.report_killed(stop_units(units, signal.SIGTERM, grace, hurry=self.signals.hurry))
        stray = sweep_launch(self.launch_id, 0.0 if self.signals.hurry() else min(grace, 10.0))
        if stray:
            self.say(f"stopped {len(stray)} process(es) of this launch that had left their session: {stray}")
        self.client.close()

    def report_killed(self, names: list[str]) -> None:
        if names:
            self.say(f"{', '.join(map(repr, names))} did not stop within launcher.shutdown_grace_s "
                     f"({self.launcher.shutdown_grace_s:g} s) or was hurried: killed (SIGKILL)", warning=True)

    def service_records(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [
            {"name": svc.name, "action": "started", "pid": unit.pid, "url": svc.url, "health_url": svc.health_url,
             "argv": list(svc.argv), "log": str(unit.log_path),
             "restarts": self.supervision[svc.name].restarts if svc.name in self.supervision else 0}
            for svc, unit in self.services
        ]
        rows += [{"name": svc.name, "action": "reused", "url": svc.url, "health_url": svc.health_url}
                 for svc in self.reused]
        return rows


def launch(plan: LaunchPlan, cfg: DictConfig, settings: AgentEvolverSettings, *, command_line: list[str],
           console: Console) -> int:
    """Run the launch; returns the exit status (the training run's, or see the module docstring)."""
    if plan.target == DEFAULT_TARGET:
        try:
            finished = finished_message(cfg)
        except OmegaConfBaseException:  # e.g. ${oc.env:X} only the trainer's machine has: main_ppo asks again
            finished = None
        if finished is not None:  # before the run record, so the finished run's record and logs stay
            say(console, finished)
            return 0
    signals = SignalFlags()
    with signals.installed():
        run = _Launch(plan, settings, console, signals)
        try:
            run.record.create(cfg, plan.experiment, {
                "command_line": shlex.join(command_line), "cwd": os.getcwd(), "launch_id": run.launch_id,
                "conf": str(plan.conf), "overrides": plan.overrides, "hydra_overrides": plan.hydra_overrides,
                "compute_dtype": describe_precision(cfg),
            })
        except OSError as err:
            say(console, f"cannot write the run record in {run.record.folder} ({err}); change "
                         "launcher.record_dir or the working directory", "error")
            return RECORD_FAILED
        run.say(f"run record: {run.record.folder}")
        code: int
        try:
            run.check_training_needs()
            run.start_services()
            run.record.update(services=run.service_records())
            code = run.run_training()
            run.say(f"training exited with status {code}")
        except LaunchError as err:
            say(console, str(err), "error")
            code = SERVICE_FAILED
        except Interrupted as stop:
            run.say(f"{stop} received: shutting down")
            code = 128 + stop.signum
        finally:
            run.record.update(services=run.service_records())
            run.shutdown()
        run.record.finish(code)
        run.say(f"done (exit status {code}); record: {run.record.folder}")
        return code


def say(console: Console, message: str, level: str | None = None) -> None:
    """One launcher message; ``message`` is plain text (log lines and paths may contain brackets)."""
    label = {None: ("launcher: ", "bold cyan"), "warning": ("launcher: warning: ", "bold yellow"),
             "error": ("launcher: error: ", "bold red")}[level]
    console.print(Text.assemble(label, message))


def stderr_console() -> Console:
    """Launcher messages go to stderr, so the training run's stdout stays its own."""
    return Console(stderr=True, highlight=False, soft_wrap=True, file=sys.stderr)
