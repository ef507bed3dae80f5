"""``python -m agentevolver.module.task_manager [--config-name NAME] [--config-dir DIR] [overrides ...]``.

Generates synthetic tasks for the configured environment (``env_service.env_type``) into
``task_manager.synthetic_tasks_path`` (JSON lines), with a progress bar and a summary table. Needs the
environment service at ``env_service.env_url`` and the LLM roles ``task_explorer``, ``task_summarizer``
(not with ``task_manager.writer: env``) and ``task_filter`` (``llm.roles``). A killed run resumes from
``task_manager.checkpoint_path``.

The summary shows, per stage, what happened and the rates that measure the LLM roles: who wrote the tasks
(``task_manager.writer``: the LLM's model, or the environment's profile); the summariser's parse rate,
re-asks and share of replies generated under the reply schema (structured outputs), or, with the
environment as writer, what its rendering skipped; for an environment whose observations prove answers,
the share of written tasks whose answer was proved and the rejections by reason; duplicates; feasibility
verdicts; every rejection by reason; what was written (distinct tasks, the level mix) and its overlap with
the evaluation splits (``task_manager.eval_splits``: 0, or the ``eval_overlap`` filter was off); then up to
five kept tasks and the wall time.

Exit status: 0 = done; 1 = done, but some explorations or judgements failed (rerun to retry them: the
finished ones are kept); 2 = a configuration or service problem (the message says what to change).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClients
from agentevolver.config.loader import ROOT_CONFIG_NAME, load_config
from agentevolver.errors import AgentEvolverError, ConfigError
from agentevolver.module.agent_flow.plugins import plugin_name_errors
from agentevolver.module.task_manager.manager import GenerationReport, TaskManager
from agentevolver.module.task_manager.seeds import seed_split, seed_tasks
from agentevolver.schema import TaskObjective

PHASES = {"explore": "explore + summarise", "filter": "post filters"}

#: Kept tasks shown after the summary table.
EXAMPLES = 5


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m agentevolver.module.task_manager",
                                     description="Generate synthetic training tasks for an environment.")
    parser.add_argument("--config-name", default=ROOT_CONFIG_NAME, help="config file name without .yaml")
    parser.add_argument("--config-dir", default=None, help="folder holding it (default: config/ and examples/)")
    parser.add_argument("--output", default=None, help="JSONL to write (default: task_manager.synthetic_tasks_path)")
    parser.add_argument("--summary-json", default=None, help="also write the counters and rates to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)")
    parser.add_argument("--log-level", default="warning", help="logging level (default: warning)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. task_manager.n=4 env_service.env_type=calc")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        report, seeds = _generate(args, console)
    except AgentEvolverError as err:
        # soft_wrap: one line, so a path in the message is never broken where a narrow console would wrap it
        console.print(f"[red]error:[/red] {err}", markup=True, highlight=False, soft_wrap=True)
        return 2
    wall_s = time.perf_counter() - started
    out = Console()
    out.print(summary_table(report, seeds))
    if report.objectives:
        out.print(examples_table(report))
    out.print(f"wall time {wall_s:.0f} s", highlight=False)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps({**summary_dict(report, seeds), "wall_s": round(wall_s, 1)},
                                                      indent=2))
    if report.failures:
        console.print(f"{len(report.failures)} exploration(s)/judgement(s) failed; rerun the same command to "
                      "retry them (finished work is kept in the checkpoint). First: " + report.failures[0])
        return 1
    return 0


def _generate(args: argparse.Namespace, console: Console) -> tuple[GenerationReport, int]:
    _cfg, settings = load_config(args.overrides, config_name=args.config_name, config_dir=args.config_dir,
                                 checks=(plugin_name_errors,))
    section = settings.task_manager
    if section.n == 0:
        raise ConfigError("task_manager.n is 0, which turns task synthesis off; pass task_manager.n=N "
                          "(explorations per seed task) to generate")
    with EnvClient.from_config(settings.env_service) as env, LLMClients(settings.llm) as llm:
        if not env.healthy():
            raise ConfigError(f"the environment service at env_service.env_url={settings.env_service.env_url} "
                              "does not answer /healthz; start it (python env_service/env_service.py --env "
                              f"{settings.env_service.env_type} --port PORT) or fix the URL")
        manager = TaskManager.from_settings(settings, env=env, llm=llm)
        seeds = seed_tasks(env, settings)
        output = args.output or section.synthetic_tasks_path
        console.print(f"{len(seeds)} seed task(s) of {settings.env_service.env_type!r} (split "
                      f"{seed_split(settings)!r}) x n={section.n} "
                      f"explorations -> {output}", highlight=False, soft_wrap=True)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=console, disable=args.no_progress) as bar:
            bars: dict[str, int] = {}

            def progress(phase: str, done: int, total: int) -> None:
                if phase not in bars:
                    bars[phase] = bar.add_task(PHASES.get(phase, phase), total=total)
                bar.update(bars[phase], completed=done, total=total)

            report = manager.generate_task(seeds, progress=progress, output_path=output)
    return report, len(seeds)


def summary_dict(report: GenerationReport, seeds: int) -> dict[str, object]:
    """The counters and rates of a run as plain data."""
    return {"seeds": seeds, "writer": report.writer, "counts": dict(report.counts), "rates": report.rates(),
            "rejections": report.rejections(), "rejected": rejected_by_reason(report),
            "levels": dict(sorted(report.levels.items())), "eval_splits": report.eval_splits,
            "metrics": report.metrics(), "failures": report.failures,
            "checkpoint": report.checkpoint_status,
            "output": str(report.output_path),
            "examples": [_example(o) for o in report.objectives[:EXAMPLES]]}


def rejected_by_reason(report: GenerationReport) -> dict[str, int]:
    """Every candidate dropped on the way, by reason (the ``tasks/rejected/<reason>`` metrics as counts)."""
    prefix = "tasks/rejected/"
    return {key.removeprefix(prefix): int(n) for key, n in report.metrics().items() if key.startswith(prefix)}


def _example(objective: TaskObjective) -> dict[str, object]:
    task = objective.task
    return {"query": task.query, "answer": task.ground_truth, "level": task.metadata.get("level"),
            "grader": task.evaluator,
            "proof": (task.metadata.get("proof") or {}).get("call")}


def examples_table(report: GenerationReport) -> Table:
    """Up to :data:`EXAMPLES` kept tasks: what a person checks first."""
    table = Table(title=f"kept tasks (first {min(EXAMPLES, len(report.objectives))} of {len(report.objectives)})",
                  header_style="bold")
    for column in ("query", "answer", "level", "grader", "proved by"):
        table.add_column(column)
    for objective in report.objectives[:EXAMPLES]:
        row = _example(objective)
        table.add_row(*(str(row[k] or "-") for k in ("query", "answer", "level", "grader", "proof")))
    return table


def summary_table(report: GenerationReport, seeds: int) -> Table:
    """What the run did, one row per stage."""
    c, rates = report.counts, report.rates()

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    table = Table(title="task generation", show_header=True, header_style="bold")
    table.add_column("stage")
    table.add_column("count", justify="right")
    table.add_column("detail")
    failed_explorations = report.failed_explorations()
    table.add_row("seed tasks", str(seeds), "")
    table.add_row("task writer", "", report.writer or "-")
    table.add_row("explorations", str(c["explorations_planned"]),
                  f"{c['explorations_run']} run now, {c['explorations_resumed']} resumed "
                  f"({report.checkpoint_status}), {failed_explorations} failed; {c['explore_steps']} env steps, "
                  f"{c['explore_tool_calls']} tool calls; {c['explore_without_tool_calls']} exploration(s) made "
                  "no tool call")
    reasks = rates["reasks_per_exploration"]
    if report.writer.startswith("env") and not c["summary_replies"]:
        table.add_row("tasks rendered by env", str(c["env_tasks_rendered"]),
                      f"from {c['env_calls_seen']} tool call(s): {c['env_calls_failed']} failed, "
                      f"{c['env_calls_not_rendered']} not renderable, {c['env_calls_merged']} repeated in one "
                      f"exploration (merged), {c['env_seed_copies']} restating the seed task, "
                      f"{c['env_over_limit']} over tasks_per_exploration; "
                      f"{c['env_service_errors']} exploration(s) the service did not render; no LLM request")
    else:
        table.add_row("summariser replies", str(c["summary_replies"]),
                      f"{c['summary_unparsed_replies']} unparseable; parse rate {pct(rates['parse_rate'])}; "
                      f"{'-' if reasks is None else f'{reasks:.2f}'} re-asks per exploration; "
                      f"{pct(rates['structured_share'])} structured (response_format), "
                      f"{c['summary_format_fallbacks']} fell back to free text; "
                      f"{c['summaries_failed']} exploration(s) without a usable summary")
    if c["answers_checked"]:
        reasons = ", ".join(f"{reason} {n}" for reason, n in report.rejections().items()) or "none"
        table.add_row("answers checked", str(c["answers_checked"]),
                      f"{c['answers_proved']} proved by the environment's observations (proof rate "
                      f"{pct(rates['proof_rate'])}); rejected: {reasons}")
    table.add_row("tasks proposed", str(c["objectives_proposed"]),
                  f"{c['summary_rejected_items']} malformed item(s) dropped"
                  + ("; only proved answers" if c["answers_checked"] else ""))
    table.add_row("duplicates dropped", str(c["dropped_exact_duplicate"] + c["dropped_near_duplicate"]),
                  f"{c['dropped_exact_duplicate']} exact, {c['dropped_near_duplicate']} near; duplicate rate "
                  f"{pct(rates['duplicate_rate'])}")
    table.add_row("judged (post filters)", str(c["judged"]),
                  f"{c['judged_kept']} kept ({c['judged_without_llm']} proved, kept without an LLM), "
                  f"{c['judged_unparsed']} unparseable verdict(s); feasibility rate {pct(rates['feasibility_rate'])}")
    reasons = ", ".join(f"{reason} {n}" for reason, n in rejected_by_reason(report).items()) or "none"
    table.add_row("rejected", str(sum(rejected_by_reason(report).values())), f"by reason: {reasons}")
    levels = ", ".join(f"{level} {n}" for level, n in sorted(report.levels.items())) or "-"
    table.add_row("tasks written", str(c["tasks_written"]),
                  f"{c['tasks_distinct']} distinct; levels: {levels}; {report.output_path}")
    if report.eval_splits:
        table.add_row("equal to an eval task", str(c["eval_overlap_written"]),
                      f"of the written, compared with {', '.join(report.eval_splits)} (must be 0); "
                      f"{c['dropped_eval_overlap']} dropped by eval_overlap")
    return table


if __name__ == "__main__":
    sys.exit(main())
