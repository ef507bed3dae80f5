"""Where a small training run's wall time goes before its first step and after its last (issue 44, part 4).

    .venv/bin/python bench/startup_profile.py [--reps 2] [--steps 2]
                                              [--arm NAME=OVERRIDE[,OVERRIDE...] ...] [--out startup.json]

Each repetition runs the test suite's training command (``tests/training_fixture.py``: ``python -m
agentevolver.main_ppo --config-name quickstart``, tiny-test, lottery, 2 tasks x 2 episodes a step) against a real
lottery environment service, with ``--verbose`` so that every process's lines reach the console, and stamps each
line as it arrives. The milestones come from those lines:

* ``ray.init called``: verl's "ray init kwargs" line, printed just before it (the driver's imports, config and
  checks are done);
* ``ray up``: Ray's "Started a local Ray instance";
* ``<Actor> up``: the first line of each actor's process (Ray prefixes it with the process id; the first line a
  verl process prints is its platform notice, written when it has imported verl), named by the actor that pid
  later prints as (TaskRunner, WorkerDict, HFRolloutServer, AgentLoopWorker, RewardLoopWorker, ...);
* ``model in FSDP``: verl's "After FSDP" line in the worker;
* ``step k``: the step table's row ``k/N`` (printed when step k's metrics are logged);
* ``exit``: the driver process ended.

"start-up" is the time to the first step's start, estimated as step 1's row minus its ``timing_s/step``;
"steps" is the sum of ``timing_s/step``; "teardown" is the time from the last row to the exit. Rows are medians
over the repetitions; with several arms (``--arm``), the arms alternate within each repetition and the table
gives each arm's start-up as a ratio of the first arm's.

A training run's fixed cost is what the suite pays about 35 times, and the quickstart once.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

#: Ray's prefix of an actor's line: "(TaskRunner pid=123)" or, before the actor has a name, "(pid=123)";
#: colour codes around it on a terminal.
PREFIX = re.compile(r"^(?:\x1b\[[0-9;]*m)?\((?:(?P<name>\w+) )?pid=(?P<pid>\d+)")
STEP_ROW = re.compile(r"^(?:\x1b\[[0-9;]*m)?(?:\(\w+ pid=\d+[^)]*\)(?:\x1b\[[0-9;]*m)? )?\s*(?P<step>\d+)/(?P<total>\d+)\s")


def stamp_lines(process: subprocess.Popen[str], began: float) -> list[tuple[float, str]]:
    """Every line the process writes (stdout and stderr merged), with the seconds since ``began`` it arrived."""
    lines: queue.Queue[tuple[float, str] | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put((time.perf_counter() - began, line.rstrip("\n")))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    out: list[tuple[float, str]] = []
    while (item := lines.get()) is not None:
        out.append(item)
    process.wait()
    reader.join()
    return out


def milestones(lines: list[tuple[float, str]], exit_s: float, step_times: dict[int, float]) -> dict[str, float]:
    """The named moments of one run (see the module docstring), in seconds from the driver's start."""
    found: dict[str, float] = {}
    first_seen: dict[str, float] = {}
    names: dict[str, str] = {}
    for at, line in lines:
        if line.startswith("ray init kwargs:"):  # verl prints it just before ray.init
            found.setdefault("ray.init called", at)
        if "Started a local Ray instance" in line:
            found.setdefault("ray up", at)
        if "After FSDP" in line:
            found.setdefault("model in FSDP", at)
        match = PREFIX.match(line)
        if match:
            first_seen.setdefault(match["pid"], at)
            if match["name"]:
                names.setdefault(match["pid"], match["name"])
        row = STEP_ROW.match(line)
        if row and "Training Progress" not in line:
            found.setdefault(f"step {int(row['step'])}", at)
    for pid, at in first_seen.items():
        name = names.get(pid, f"pid {pid}")
        found.setdefault(f"{name} up", at)  # an actor class with several processes: its first one
    found["exit"] = exit_s
    if "step 1" in found and 1 in step_times:
        found["step 1 starts (est.)"] = found["step 1"] - step_times[1]
    return dict(sorted(found.items(), key=lambda item: item[1]))


def process_label(cmdline: list[str], name: str) -> str:
    """Which part of a run a process is: a Ray actor by its class (its title is ``ray::Class.method``), Ray's own
    daemons by their program, anything else by its name."""
    title = " ".join(cmdline)
    if title.startswith("ray::"):
        return "ray::" + title[5:].split(".")[0].split(" ")[0].split(":")[0]
    for marker, label in (("gcs_server", "ray gcs_server"), ("raylet", "ray raylet"),
                          ("dashboard/agent.py", "ray dashboard agent"), ("runtime_env/agent", "ray runtime-env agent"),
                          ("log_monitor.py", "ray log monitor"), ("agentevolver.main_ppo", "driver (main_ppo)")):
        if marker in title:
            return label
    return name


class CpuSampler(threading.Thread):
    """CPU seconds (user + system) of every process below ``root``, read every ``interval`` s and kept per process at
    its last reading, then summed by :func:`process_label`. A process that lives less than one interval is missed
    and the last interval of each is lost: the sums are a floor. On a machine whose cores are all busy (the test
    suite runs two training runs at once) a run costs its CPU seconds, not its start-up's wall time."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.seen: dict[int, tuple[str, float]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.is_set():
            try:
                family = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
            except psutil.Error:
                family = []
            for process in family:
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        label = process_label(process.cmdline(), process.name())
                except psutil.Error:
                    continue
                known = self.seen.get(process.pid)
                if known and known[0].startswith(label):  # an exiting process shows only its 15-letter comm name
                    label = known[0]
                self.seen[process.pid] = (label, times.user + times.system)
            self.done.wait(self.interval)

    def by_label(self) -> dict[str, float]:
        self.done.set()
        self.join()
        sums: dict[str, float] = {}
        for label, seconds in self.seen.values():
            sums[label] = sums.get(label, 0.0) + seconds
        return dict(sorted(sums.items(), key=lambda item: -item[1]))


def run_once(service: str, arm: list[str], steps: int, folder: Path) -> dict:
    from training_fixture import training_command, training_env

    from agentevolver.verl.tracking import read_metrics

    command = [*training_command(service, folder, f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
                                 *arm), "--verbose"]
    began = time.perf_counter()
    process = subprocess.Popen(command, cwd=folder, env=training_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    sampler = CpuSampler(process.pid)
    sampler.start()
    lines = stamp_lines(process, began)
    cpu = sampler.by_label()
    exit_s = time.perf_counter() - began
    if process.returncode != 0:
        tail = "\n".join(line for _, line in lines[-40:])
        raise SystemExit(f"the run failed (exit {process.returncode}); its last lines:\n{tail}")
    metrics = read_metrics(folder / "run" / "metrics.jsonl")
    step_times = {step: values["timing_s/step"] for step, values in metrics.items()}
    marks = milestones(lines, exit_s, step_times)
    startup = marks.get("step 1 starts (est.)", float("nan"))
    last = marks.get(f"step {steps}", float("nan"))
    return {"marks": marks, "startup_s": startup, "steps_s": sum(step_times.values()), "teardown_s": exit_s - last,
            "total_s": exit_s, "cpu_s": cpu, "cpu_total_s": sum(cpu.values())}


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--arm", action="append", default=[],
                        help="NAME=OVERRIDE[,OVERRIDE...]: another set of overrides to compare (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="write every run's milestones here (JSON)")
    args = parser.parse_args()
    arms: dict[str, list[str]] = {"as shipped": []}
    for spec in args.arm:
        name, _, overrides = spec.partition("=")
        if not name or not overrides:
            parser.error(f"--arm {spec!r}: write NAME=OVERRIDE[,OVERRIDE...]")
        arms[name] = overrides.split(",")

    from env_service_fixture import env_service

    print(f"load average at the start: {load_average()}")
    results: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="startup_profile-") as scratch, \
            env_service("lottery", tmp_path=Path(scratch)) as running:
        for rep in range(args.reps):
            order = list(arms) if rep % 2 == 0 else list(reversed(arms))
            for name in order:
                folder = Path(scratch) / f"{name.replace(' ', '_')}-{rep}"
                folder.mkdir()
                result = run_once(running.url, arms[name], args.steps, folder)
                results[name].append(result)
                print(f"rep {rep} {name}: start-up {result['startup_s']:.1f} s, steps {result['steps_s']:.1f} s, "
                      f"teardown {result['teardown_s']:.1f} s, total {result['total_s']:.1f} s, "
                      f"CPU {result['cpu_total_s']:.1f} s "
                      f"(load {load_average()})", flush=True)
    print(f"load average at the end: {load_average()}\n")

    first = next(iter(arms))
    for name, runs in results.items():
        print(f"## {name}: milestones, s from the driver's start (median of {len(runs)})\n")
        print("| milestone | s | since the previous |\n|---|---|---|")
        keys = [key for key in runs[0]["marks"] if all(key in run["marks"] for run in runs)]
        medians = {key: statistics.median(run["marks"][key] for run in runs) for key in keys}
        previous = 0.0
        for key, value in sorted(medians.items(), key=lambda item: item[1]):
            print(f"| {key} | {value:.1f} | {value - previous:+.1f} |")
            previous = value
        print()
    labels = sorted({label for runs in results.values() for run in runs for label in run["cpu_s"]},
                    key=lambda label: -statistics.median(run["cpu_s"].get(label, 0.0) for run in results[first]))
    print("## CPU seconds by process (user + system, median; a floor, see CpuSampler)\n")
    print("| process | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    for label in labels:
        cells = [statistics.median(run["cpu_s"].get(label, 0.0) for run in runs) for runs in results.values()]
        print(f"| {label} | " + " | ".join(f"{cell:.1f}" for cell in cells) + " |")
    print()
    print("| arm | start-up s | steps s | teardown s | total s | CPU s | start-up vs first | CPU vs first |\n"
          "|---|---|---|---|---|---|---|---|")
    base = statistics.median(run["startup_s"] for run in results[first])
    base_cpu = statistics.median(run["cpu_total_s"] for run in results[first])
    for name, runs in results.items():
        cells = [statistics.median(run[key] for run in runs) for key in ("startup_s", "steps_s", "teardown_s",
                                                                           "total_s", "cpu_total_s")]
        print(f"| {name} | " + " | ".join(f"{cell:.1f}" for cell in cells)
              + f" | {base / cells[0]:.2f}x | {base_cpu / cells[4]:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
