"""``python -m agentevolver.experiments ablation --conf ABLATION.yaml [--arms a,b] [--seeds N] [--out DIR]
[--dry-run] [-- OVERRIDES]`` and ``python -m agentevolver.experiments report DIR``.

Exit status of ``ablation``: 0 every run done; 1 a run failed (the others ran); 2 a bad ablation file,
override or command line (nothing was started); 3 the shared services could not be started; 128 + N when
stopped by signal N (130 = Ctrl-C). docs/experiments.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentevolver.errors import ConfigError
from agentevolver.experiments.plan import AblationPlan, compose_runs, plan_ablation
from agentevolver.experiments.report import (
    RunResult,
    arm_rows,
    environments,
    k_label,
    summarize,
    write_report,
)
from agentevolver.experiments.runner import Runner
from agentevolver.experiments.spec import load_spec, parse_arms
from agentevolver.experiments.state import RunState, now

__all__ = ["PLAN_FILE", "main"]

#: The plan of the last invocation, in the ablation folder (``report`` reads it).
PLAN_FILE = "ablation.json"
USAGE_ERROR = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agentevolver.experiments",
        description="Ablations: every arm x seed as a normal launcher run, services shared, resumable; a report "
                    "folder with a table, validation curves and the exact commands (docs/experiments.md).")
    commands = parser.add_subparsers(dest="command", required=True)
    ablation = commands.add_parser(
        "ablation", help="run (or resume) an ablation",
        description="Run every arm x seed of an ablation file through the launcher, one after the other, with the "
                    "services started once; finished runs are skipped, so a stopped ablation resumes. Hydra "
                    "overrides after `--` apply to every run.")
    ablation.add_argument("--conf", type=Path, required=True,
                          help="the ablation file (e.g. examples/ablation/quickstart.yaml)")
    ablation.add_argument("--arms", default=None,
                          help="comma-separated arms to run, in this order (default: every arm of the file)")
    ablation.add_argument("--seeds", type=int, default=None,
                          help="seeds per arm: 0 .. N-1 (default: the file's `seeds`)")
    ablation.add_argument("--out", type=Path, default=None,
                          help="the ablation folder: runs, report (default: ablations/<name>)")
    ablation.add_argument("--dry-run", action="store_true",
                          help="compose every run's config, list the runs (done / to resume / new) and their "
                               "commands, start nothing")
    ablation.add_argument("--report-only", action="store_true",
                          help="write the report over this selection of arms and seeds from the runs on disk "
                               "(e.g. every arm, while the runs were started by several invocations), start "
                               "nothing")
    report = commands.add_parser("report", help="rewrite the report of an ablation folder from its runs",
                                 description="Rewrite README.md, curves.png, commands.sh and summary.json of an "
                                             "ablation folder from what its runs have written so far.")
    report.add_argument("folder", type=Path, help="the ablation folder (--out of the ablation)")
    return parser


def main(argv: list[str] | None = None, *, console: Console | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    ours, overrides = (args_in[: args_in.index("--")], args_in[args_in.index("--") + 1:]) if "--" in args_in \
        else (args_in, [])
    args = _parser().parse_args(ours)
    console = console or Console(highlight=False, soft_wrap=True)
    command_line = shlex.join(["python", "-m", "agentevolver.experiments", *args_in])
    try:
        if args.command == "report":
            return _report(args.folder, console)
        plan = _plan(args, overrides, console)
    except ConfigError as err:
        print(f"ablation: error: {err}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        return 130
    if args.dry_run:
        _print_dry_run(plan, console)
        return 0
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / PLAN_FILE).write_text(json.dumps({**plan.to_json(), "command_line": command_line, "written": now()},
                                                 indent=2), encoding="utf-8")
    results = write_report(plan, command_line)
    if args.report_only:
        _print_summary(plan, results, console)
        console.print(f"report: {plan.out / 'README.md'}  (curves.png, commands.sh, summary.json)")
        return 0
    code = Runner(plan, console, after_run=lambda: _refresh_report(plan, command_line, console)).run()
    results = write_report(plan, command_line)
    _print_summary(plan, results, console)
    console.print(f"report: {plan.out / 'README.md'}  (curves.png, commands.sh, summary.json)")
    return code


def _refresh_report(plan: AblationPlan, command_line: str, console: Console) -> None:
    """The report after each run; a failure to write it is reported, never the end of a long ablation."""
    try:
        write_report(plan, command_line)
    except Exception as err:  # any plotting or disk error: warn, the runs go on
        _plain_printer(console)(f"ablation: warning: could not update the report in {plan.out}: "
                                f"{type(err).__name__}: {err}")


def _plan(args: argparse.Namespace, overrides: list[str], console: Console) -> AblationPlan:
    spec = load_spec(args.conf)
    if args.seeds is not None and args.seeds < 1:
        raise ConfigError(f"--seeds {args.seeds}: at least 1")
    seeds = list(range(args.seeds if args.seeds is not None else spec.seeds))
    out = args.out if args.out is not None else Path("ablations") / spec.name
    plan = plan_ablation(spec, args.conf, parse_arms(spec, args.arms), seeds, out, overrides)
    say = _plain_printer(console)
    say(f"ablation {spec.name!r}: composing the config of {len(plan.runs)} run(s) ({len(plan.arms)} arm(s) x "
        f"{len(seeds)} seed(s))")
    compose_runs(plan)
    for run in plan.runs:
        RunState(run).check_same_command()
    for key, values in plan.budget_differences().items():
        say(f"ablation: warning: the arms differ in budget key {key} (not a like-for-like comparison): "
            + ", ".join(f"{arm}={value!r}" for arm, value in values.items()))
    return plan


def _print_dry_run(plan: AblationPlan, console: Console) -> None:
    say = _plain_printer(console)
    say(f"ablation {plan.spec.name!r} (--dry-run: nothing started); folder {plan.out}")
    if plan.services:
        say("shared services, started once for every run: "
            + ", ".join(f"{name} ({plan.hold_health_urls.get(name, '?')})" for name in plan.services))
        say(f"  services launch: {shlex.join(plan.hold_argv)}")
    for index, run in enumerate(plan.runs, 1):
        state = RunState(run)
        status = "done: skipped" if state.is_done() else \
            f"to resume (attempt {len(state.attempts) + 1})" if state.attempts else "new"
        say(f"{index}. {run.key}  [{status}]  {_steps_shown(run.total_steps)} -> {run.run_dir}")
        say("   roles: " + "; ".join(f"{role}: {source}" for role, source in run.roles.items()))
        say(f"   {shlex.join(run.argv)}")


def _plain_printer(console: Console) -> Callable[[str], None]:
    """Print text as is (overrides such as trainer.logger=[table,jsonl] are not rich markup)."""
    return lambda text: console.print(text, markup=False, highlight=False)


def _print_summary(plan: AblationPlan, results: list[RunResult], console: Console) -> None:
    k = k_label(results)
    for env in environments(results):
        table = Table(title=f"validation success on {env} (%)")
        for column in ("arm", "runs", f"avg@{k} before", f"avg@{k} after", "Δ", f"avg@{k} / best@{k} after",
                       "wall / run"):
            table.add_column(column)
        rows = arm_rows(plan, results, env)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row[:-1]))
        console.print(table)
    say = _plain_printer(console)
    for summary in summarize(plan, results):
        say(f"roles of {summary.arm}: " + "; ".join(f"{role}: {source}" for role, source in summary.roles.items()))


def _report(folder: Path, console: Console) -> int:
    path = folder / PLAN_FILE
    if not path.is_file():
        raise ConfigError(f"{folder}: no {PLAN_FILE} here; give the folder an ablation wrote (its --out)")
    data = json.loads(path.read_text(encoding="utf-8"))
    plan = AblationPlan.from_json(data)
    results = write_report(plan, data.get("command_line", ""))
    _print_summary(plan, results, console)
    console.print(f"report: {plan.out / 'README.md'}")
    return 0


def _steps_shown(total_steps: int | None) -> str:
    """A run's length as the dry run lists it: validation only (0), its steps, or unknown."""
    return "validation only" if total_steps == 0 else f"{total_steps or '?'} steps"
