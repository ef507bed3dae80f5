"""Run an ablation: the shared services once, then every unfinished run, one at a time, then the report.

1. Runs already done (``state.RunState.is_done``) are skipped; the others will run, in plan order.
2. The services every run needs (the union over the selected arms) are started by one launch of the launcher
   whose target, :mod:`agentevolver.experiments.hold`, only waits: the launcher starts them (or reuses ones
   that already answer), checks their health, logs them into ``<out>/records/<name>-services/logs/``, and
   stops them when the ablation ends, or when the ablation's process dies.
3. Each run is its own launcher process (``commands.sh`` has the command) with the same ``--with-...`` flags;
   the services already answer, so the launch reuses them instead of starting its own.
4. The report is written at the end, also after a failure or Ctrl-C.

Ctrl-C (or SIGTERM) is forwarded to the running launch as a Ctrl-C (a second one hurries it), then the
services launch is stopped the same way; the interrupted run is redone (resumed) by the next invocation.
A run that fails is recorded and the ablation goes on with the next one, on freshly started shared services
(what the failed run left in them, e.g. live env instances, would reach the next run); the exit status is
then 1.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable

from rich.console import Console
from rich.text import Text

from agentevolver.experiments.hold import PARENT_ENV, READY_FILE
from agentevolver.experiments.plan import AblationPlan, RunPlan
from agentevolver.experiments.report import collect
from agentevolver.experiments.state import METRICS_FILE, RunState, final_step_logged
from agentevolver.finished_run import latest_checkpoint_step
from agentevolver.launcher.processes import Unit, exit_status, start_unit, stop_units, sweep_launch
from agentevolver.launcher.services import tail
from agentevolver.launcher.signals import SignalFlags

__all__ = ["SERVICES_FAILED", "Runner"]

#: Exit status when the shared services could not be started.
SERVICES_FAILED = 3
#: Exit status when a run failed (the others went on).
RUN_FAILED = 1

_POLL_S = 0.5
#: How long a launcher gets to stop its training run and services after Ctrl-C before it is killed: its own
#: shutdown allows launcher.shutdown_grace_s (30 s by default) for each of the two, plus a final sweep.
_LAUNCHER_GRACE_S = 150.0


class _Interrupted(Exception):
    pass


class Runner:
    """Carries out an :class:`AblationPlan` whose runs are composed (``plan.compose_runs``)."""

    def __init__(self, plan: AblationPlan, console: Console, after_run: Callable[[], None] = lambda: None) -> None:
        self.plan = plan
        self.after_run = after_run
        self.console = console
        self.signals = SignalFlags()
        self.launch_id = uuid.uuid4().hex  # the launchers we start carry it (their own children get theirs)
        self.logs = plan.out / "logs"
        self.services: Unit | None = None

    def say(self, message: str, style: str = "bold cyan") -> None:
        self.console.print(Text.assemble(("ablation: ", style), message))

    def run(self) -> int:
        """Run every unfinished run; returns the exit status (0 all done, 1 a run failed, 3 services failed,
        128 + N stopped by signal N)."""
        todo = [run for run in self.plan.runs if not RunState(run).is_done()]
        done = len(self.plan.runs) - len(todo)
        if done:
            self.say(f"{done} of {len(self.plan.runs)} runs already done (skipped): "
                     + ", ".join(r.key for r in self.plan.runs if r not in todo))
        if not todo:
            return 0
        failed: list[str] = []
        with self.signals.installed():
            try:
                self.start_services()
                for index, run in enumerate(todo, 1):
                    if self.signals.received is not None:
                        raise _Interrupted
                    code = self.run_one(run, f"[{index}/{len(todo)}]")
                    self.after_run()
                    if self.signals.received is not None:
                        raise _Interrupted
                    if code != 0:
                        failed.append(run.key)
                        if index < len(todo):
                            self.restart_services(run)
            except _Interrupted:
                signum = self.signals.received or signal.SIGINT
                self.stop_services()
                self.say(f"{signal.Signals(signum).name} received: stopped; run the same command again to go on "
                         "(finished runs are not redone)", "bold yellow")
                return 128 + signum
            except _ServicesFailed as err:
                self.say(str(err), "bold red")
                return SERVICES_FAILED
            finally:
                self.stop_services()
                sweep_launch(self.launch_id, 10.0)
        if failed:
            self.say(f"{len(failed)} run(s) failed: {', '.join(failed)} (see their logs in {self.logs}); run the "
                     "same command again to retry them", "bold red")
            return RUN_FAILED
        return 0

    # -- services ---------------------------------------------------------------------------------------------
    def start_services(self) -> None:
        if not self.plan.services:
            return
        ready = self.plan.hold_record / READY_FILE
        ready.unlink(missing_ok=True)
        log = self.logs / "services.log"
        self.say(f"starting the shared services ({', '.join(self.plan.services)}) with the launcher; log: {log}")
        self.services = start_unit("services", self.plan.hold_argv, env={**os.environ, PARENT_ENV: str(os.getpid())},
                                   launch_id=self.launch_id, log_path=log)
        while not ready.exists():
            if self.signals.received is not None:
                raise _Interrupted
            if self.services.process.poll() is not None:
                code = exit_status(self.services.process.returncode)
                raise _ServicesFailed(f"the shared services launch exited with status {code} before they were "
                                      f"ready; log: {log}\n{tail(log, 30)}")
            time.sleep(_POLL_S)
        self.say("shared services ready: " + ", ".join(f"{name} {url}" for name, url in
                                                        self.plan.hold_health_urls.items()))

    def restart_services(self, failed: RunPlan) -> None:
        """Fresh shared services before the next run, after ``failed`` ended badly.

        Why: a run that dies (killed for memory, a crash) leaves its state in the services it shared. Its
        episodes' env instances stay live until the env service's idle reaper frees them (an hour by default),
        holding slots of the service's cap: the next run's validation then had a fifth of its episodes refused
        (``too_many_instances``) and scored them as failures (issue 43: a run validated 18.5% where every other
        seed's untrained model scored 36.0%). Runs share the services one after another, so nothing else holds
        them.
        """
        if self.services is None:
            return
        self.say(f"{failed.key} failed: restarting the shared services, so that nothing it left in them (live env "
                 "instances, queued requests) reaches the next run", "bold yellow")
        self.stop_services()
        self.start_services()

    def stop_services(self) -> None:
        if self.services is None:
            return
        if self.services.process.poll() is None:
            self.say("stopping the shared services")
        stop_units([self.services], signal.SIGINT, _LAUNCHER_GRACE_S)
        self.services = None

    # -- one run ----------------------------------------------------------------------------------------------
    def run_one(self, run: RunPlan, counter: str) -> int:
        state = RunState(run)
        attempt = len(state.attempts) + 1
        log = self.logs / f"{run.arm}-seed{run.seed}.{attempt}.log"
        from_step = latest_checkpoint_step(run.run_dir)  # the runner launches with trainer.resume_mode=auto
        again = ""
        if attempt > 1:
            again = (f" (attempt {attempt}: resumes from its checkpoint of step {from_step})" if from_step else
                     f" (attempt {attempt}: no checkpoint, so from step 0)")
        self.say(f"{counter} {run.key}{again}: log {log}")
        if not from_step:
            self.set_aside_metrics(run, attempt)
        state.begin(log, from_step or 0)
        started = time.monotonic()
        unit = start_unit(run.key, run.argv, env={**os.environ}, launch_id=self.launch_id, log_path=log)
        forwarded = 0
        while unit.process.poll() is None:
            if self.signals.count > forwarded:  # Ctrl-C: the launcher stops its training run (twice: hurries)
                forwarded = self.signals.count
                with contextlib.suppress(ProcessLookupError):
                    os.kill(unit.pid, signal.SIGINT)
                if forwarded == 1:
                    self.say(f"stopping {run.key} (Ctrl-C again to hurry)", "bold yellow")
            if self.services is not None and self.services.process.poll() is not None:
                self.say("the shared services launch ended while a run was going (see "
                         f"{self.logs / 'services.log'}); later runs start the services they need themselves",
                         "bold yellow")
                self.services = None
            time.sleep(_POLL_S)
        code = exit_status(unit.process.returncode)
        stop_units([unit], signal.SIGINT, _LAUNCHER_GRACE_S)  # nothing left in its session (normally a no-op)
        wall = time.monotonic() - started
        complete = final_step_logged(run.run_dir, run.total_steps) or (code == 0 and run.total_steps is None)
        if code == 0 and complete:
            state.end(code, wall, "done")
            self.say(f"{run.key}: done in {wall / 60:.1f} min; {describe_run(self.plan, run)}", "bold green")
        elif self.signals.received is not None:
            state.end(code, wall, "stopped")
        else:
            reason = (f"exited 0 but {run.run_dir / 'metrics.jsonl'} has no line for the final step "
                      f"{run.total_steps}" if code == 0 else f"the launch exited with status {code}")
            state.end(code, wall, "failed", reason)
            self.say(f"{run.key}: failed ({reason}); log: {log}", "bold red")
            return code or RUN_FAILED
        return 0 if code == 0 else code

    def set_aside_metrics(self, run: RunPlan, attempt: int) -> None:
        """A run that starts from step 0 again writes a new ``metrics.jsonl``: the earlier attempts' one is kept
        as ``metrics.before-attempt<N>.jsonl`` (appending to it would leave keys only they logged in the
        run's steps)."""
        metrics = run.run_dir / METRICS_FILE
        if metrics.is_file():
            kept = metrics.with_name(f"metrics.before-attempt{attempt}.jsonl")
            metrics.replace(kept)
            self.say(f"{run.key}: starts from step 0, so the earlier attempts' metrics are kept as {kept.name}")


def describe_run(plan: AblationPlan, run: RunPlan) -> str:
    """One line about a finished run's validation (before -> after, per environment)."""
    result = next(r for r in collect(plan) if r.run is run)
    parts = []
    for env in sorted(result.avg):
        before, after = result.before(env), result.after(env)
        parts.append(f"validation {env} avg@{result.k}: "
                     f"{'-' if before is None else f'{100 * before:.1f}%'} -> "
                     f"{'-' if after is None else f'{100 * after:.1f}%'}")
    return "; ".join(parts) or "no validation metrics"


class _ServicesFailed(Exception):
    pass

