"""The ablation's report folder: ``README.md`` (tables), ``curves.png`` (validation curves), ``commands.sh``
(the exact command of every run) and ``summary.json`` (every number of the tables, per run and per arm).

Validation success is verl's ``val-core/<env>/acc/mean@k`` (the mean success over the k validation
samples of each task: the reference's avg@k) and ``val-core/<env>/acc/best@k/mean`` (best@k; verl logs it
only for k > 1, and best@1 = avg@1). "Before" is the validation at step 0 (``trainer.val_before_train``),
"after" the one at the run's final step. Per arm: the mean over the finished seeds, ± their sample
standard deviation (n - 1; none for one seed). Numbers are percentages.

Per task (:mod:`~agentevolver.experiments.records`): each run's final validation as verl dumped it, sample by
sample; the report scores it per level and, for every arm with a baseline, counts the tasks solved by one arm and
not the other over the seeds both finished, with the exact McNemar p-value, beside the seed-level differences.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from agentevolver.config.schema import RolloutMode
from agentevolver.experiments.plan import AblationPlan, RunPlan
from agentevolver.experiments.records import (
    McNemar,
    TaskRecord,
    keep_compact,
    mcnemar,
    per_level,
    read_records,
    solved_tasks,
)
from agentevolver.experiments.state import RunState, now, read_metrics_file
from agentevolver.module.exp_manager.manager import compare_key

__all__ = ["ArmSummary", "PairedDifference", "RunResult", "arm_rows", "collect", "environments", "experience_rows",
           "k_label", "level_rows", "paired_differences", "paired_tasks", "summarize", "write_report"]

#: verl's validation metrics: ``<core>/<env>/<var>/mean@k`` and ``<core>/<env>/<var>/best@k/mean``, where core is
#: ``val-core`` for the regular pass (and ``val-exp_<mode>-core`` for val_compare_mode's second one).
_CORE = "val-core"


def _mean_pattern(core: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(core)}/(?P<env>.+)/(?P<var>[^/]+)/mean@(?P<k>\d+)$")


def _best_pattern(core: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(core)}/(?P<env>.+)/(?P<var>[^/]+)/best@(?P<k>\d+)/mean$")


@dataclass
class RunResult:
    """One run's outcome: status, wall time and validation curves per environment (fractions 0..1)."""

    run: RunPlan
    status: str
    attempts: int
    wall_s: float | None
    k: int | None = None
    avg: dict[str, dict[int, float]] = field(default_factory=dict)  # env -> step -> avg@k
    best: dict[str, dict[int, float]] = field(default_factory=dict)  # env -> step -> best@k
    #: Self-Navigating's split of training success (mean over the steps that logged it), and the share of
    #: validation episodes that had experience at the final step, per env; None where not logged.
    success_with_experience: float | None = None
    success_without_experience: float | None = None
    validation_experience: dict[str, float] = field(default_factory=dict)
    #: The machines its attempts ran on (RunState.machines; empty for runs recorded before machines were).
    machines: list[dict[str, Any]] = field(default_factory=list)
    #: The final step's second validation pass (``exp_manager.val_compare_mode``): mode -> env -> avg@k.
    compared: dict[str, dict[str, float]] = field(default_factory=dict)
    #: The training dataset's ``tasks/*`` metrics as last logged (the mixture's size; Self-Questioning's
    #: generation funnel: written, rejected by reason); {} when the run logged none.
    tasks: dict[str, float] = field(default_factory=dict)
    #: The final validation's per-sample records (``<run dir>/validation/<final step>.jsonl``); [] when the run
    #: is unfinished or wrote none.
    records: list[TaskRecord] = field(default_factory=list)
    #: step -> env -> the share of that validation's episodes a service failure ended (``failed/mean@k``), only
    #: where it is above 0: verl scores them as failed tasks, so that step's score is not the model's alone.
    validation_failures: dict[int, dict[str, float]] = field(default_factory=dict)

    def before(self, env: str) -> float | None:
        return self.avg.get(env, {}).get(0)

    def after(self, env: str, curve: str = "avg") -> float | None:
        if self.status != "done" or self.run.total_steps is None:
            return None
        return getattr(self, curve).get(env, {}).get(self.run.total_steps)


@dataclass
class ArmSummary:
    """An arm over its seeds (finished runs only)."""

    arm: str
    planned: int
    done: list[RunResult]
    roles: dict[str, str]

    def values(self, env: str, which: str) -> list[float]:
        picked = {"before": lambda r: r.before(env), "after": lambda r: r.after(env),
                  "best": lambda r: r.after(env, "best"), "delta": lambda r: _delta(r, env)}[which]
        return [value for result in self.done if (value := picked(result)) is not None]

    def wall(self) -> list[float]:
        return [result.wall_s for result in self.done if result.wall_s is not None]


def _delta(result: RunResult, env: str) -> float | None:
    before, after = result.before(env), result.after(env)
    return None if before is None or after is None else after - before


def _curves(metrics: dict[int, dict[str, float | None]], core: str = _CORE) -> tuple[int | None, dict, dict]:
    """(k, env -> step -> avg@k, env -> step -> best@k) from a run's metrics under ``core``; ``acc`` preferred
    over ``reward`` (verl's own choice of the core variable). best@1 is avg@1."""
    mean_key, best_key = _mean_pattern(core), _best_pattern(core)
    avg: dict[tuple[str, str], dict[int, float]] = {}
    best: dict[tuple[str, str], dict[int, float]] = {}
    k_seen: set[int] = set()
    for step, line in metrics.items():
        for key, value in line.items():
            if value is None:
                continue
            if m := mean_key.match(key):
                avg.setdefault((m["env"], m["var"]), {})[step] = value
                k_seen.add(int(m["k"]))
            elif m := best_key.match(key):
                best.setdefault((m["env"], m["var"]), {})[step] = value
    envs = sorted({env for env, _var in avg})
    out_avg: dict[str, dict[int, float]] = {}
    out_best: dict[str, dict[int, float]] = {}
    for env in envs:
        var = "acc" if (env, "acc") in avg else "reward"
        out_avg[env] = dict(sorted(avg.get((env, var), {}).items()))
        out_best[env] = dict(sorted(best.get((env, var), out_avg[env]).items()))
    return (max(k_seen) if k_seen else None), out_avg, out_best


def collect(plan: AblationPlan) -> list[RunResult]:
    """Every planned run's status and curves, as they are on disk now (each run's validation dumps condensed
    first into its tracked per-task file: :func:`~agentevolver.experiments.records.keep_compact`)."""
    results = []
    for run in plan.runs:
        if run.run_dir.is_dir():
            keep_compact(run.run_dir)
        state = RunState(run)
        done = state.is_done()
        metrics = read_metrics_file(run.run_dir)
        k, avg, best = _curves(metrics)
        results.append(RunResult(run=run, status="done" if done else state.status, attempts=len(state.attempts),
                                 wall_s=state.wall_s(), k=k, avg=avg, best=best,
                                 success_with_experience=_step_mean(metrics, "exp/success_with_experience"),
                                 success_without_experience=_step_mean(metrics, "exp/success_without_experience"),
                                 validation_experience=_final_experience(metrics, run.total_steps),
                                 compared=_final_compared(metrics, run.total_steps),
                                 tasks=_last_logged(metrics, "tasks/"), machines=state.machines(),
                                 records=read_records(run.run_dir, run.total_steps)
                                 if done and run.total_steps is not None else [],
                                 validation_failures=_validation_failures(metrics)))
    return results


def _last_logged(metrics: dict[int, dict[str, float | None]], prefix: str) -> dict[str, float]:
    """The keys under ``prefix`` from the last step that logged any (a resumed run logs them again)."""
    for _step, line in sorted(metrics.items(), reverse=True):
        found = {key: value for key, value in line.items() if key.startswith(prefix) and value is not None}
        if found:
            return found  # type: ignore[return-value]
    return {}


def _step_mean(metrics: dict[int, dict[str, float | None]], key: str) -> float | None:
    values = [line[key] for step, line in metrics.items() if step > 0 and line.get(key) is not None]
    return statistics.fmean(values) if values else None  # type: ignore[arg-type]


_VAL_EXPERIENCE = re.compile(r"^val-aux/(?P<env>.+)/experience/mean@\d+$")
_VAL_FAILED = re.compile(r"^val-aux/(?P<env>.+)/failed/mean@\d+$")


def _validation_failures(metrics: dict[int, dict[str, float | None]]) -> dict[int, dict[str, float]]:
    """step -> env -> share of validation episodes ended by a service failure, where above 0."""
    out: dict[int, dict[str, float]] = {}
    for step, line in metrics.items():
        for key, value in line.items():
            if value and (m := _VAL_FAILED.match(key)):
                out.setdefault(step, {})[m["env"]] = float(value)
    return out


def failure_notes(results: list[RunResult], env: str) -> list[str]:
    """One line per run whose validation on ``env`` had episodes a service failure ended (their tasks scored as
    failed), for that environment's section of the report."""
    notes = []
    for r in results:
        steps = [(step, envs[env]) for step, envs in sorted(r.validation_failures.items()) if env in envs]
        if steps:
            where = "; ".join(f"step {step}: {env} {share:.1%}" for step, share in steps)
            notes.append(f"- **{r.run.key}**: {where} of the validation episodes ended by a service failure")
    return notes


def _final_experience(metrics: dict[int, dict[str, float | None]], final: int | None) -> dict[str, float]:
    line = metrics.get(final, {}) if final is not None else {}
    return {m["env"]: value for key, value in line.items()
            if value is not None and (m := _VAL_EXPERIENCE.match(key))}


def _final_compared(metrics: dict[int, dict[str, float | None]], final: int | None) -> dict[str, dict[str, float]]:
    """mode -> env -> the final step's avg@k of the ``val_compare_mode`` pass, read as the regular pass is
    (:func:`_curves` under the pass's own names, :func:`compare_key`); {} when the run had none."""
    out: dict[str, dict[str, float]] = {}
    for mode in get_args(RolloutMode):
        _k, avg, _best = _curves(metrics, compare_key(_CORE, mode))
        finals = {env: curve[final] for env, curve in avg.items() if final in curve}
        if finals:
            out[mode] = finals
    return out


@dataclass
class PairedDifference:
    """An arm against its baseline, seed by seed: after(arm, seed) - after(baseline, seed), on the seeds both
    finished. The interval is Student's t at 95% over those differences (none for fewer than 2 seeds)."""

    arm: str
    baseline: str
    diffs: dict[int, float]

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.diffs.values()) if self.diffs else None

    def interval(self) -> tuple[float, float] | None:
        if len(self.diffs) < 2:
            return None
        from scipy import stats

        values = list(self.diffs.values())
        half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
        mean = statistics.fmean(values)
        return mean - half, mean + half


def _seed_pairs(plan: AblationPlan, results: list[RunResult],
                keep: Callable[[RunResult], bool] = lambda _r: True) -> Iterator[tuple[str, str, dict]]:
    """(arm, baseline, seed -> (arm's run, baseline's run)) for every arm that names a baseline (``baseline`` in
    the ablation file), over the seeds both finished with a run that ``keep`` accepts."""
    finished = {(r.run.arm, r.run.seed): r for r in results if r.status == "done" and keep(r)}
    for arm in plan.arms:
        if arm.baseline is None:
            continue
        pairs = {seed: (finished[(arm.name, seed)], finished[(arm.baseline, seed)]) for seed in plan.seeds
                 if (arm.name, seed) in finished and (arm.baseline, seed) in finished}
        yield arm.name, arm.baseline, pairs


def paired_differences(plan: AblationPlan, results: list[RunResult], env: str) -> list[PairedDifference]:
    """Every arm that names a baseline (``baseline`` in the ablation file), against it."""
    out = []
    for arm, baseline, pairs in _seed_pairs(plan, results):
        diffs = {}
        for seed, (mine, theirs) in pairs.items():
            a, b = mine.after(env), theirs.after(env)
            if a is not None and b is not None:
                diffs[seed] = a - b
        out.append(PairedDifference(arm, baseline, diffs))
    return out


def paired_rows(plan: AblationPlan, results: list[RunResult], env: str) -> list[list[str]]:
    rows = []
    for pair in paired_differences(plan, results, env):
        interval = pair.interval()
        rows.append([pair.arm, pair.baseline, str(len(pair.diffs)),
                     "—" if pair.mean is None else f"{100 * pair.mean:+.1f}",
                     "—" if interval is None else f"[{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]",
                     ", ".join(f"{seed}: {100 * d:+.1f}" for seed, d in sorted(pair.diffs.items())) or "—"])
    return rows


def paired_tasks(plan: AblationPlan, results: list[RunResult]) -> list[McNemar]:
    """Every arm that names a baseline, against it task by task: the McNemar count of their final validations,
    pooled over the seeds both finished with per-task records (:func:`~agentevolver.experiments.records.mcnemar`)."""
    return [mcnemar(arm, baseline, {seed: (solved_tasks(mine.records), solved_tasks(theirs.records))
                                    for seed, (mine, theirs) in pairs.items()})
            for arm, baseline, pairs in _seed_pairs(plan, results, lambda r: bool(r.records)) if pairs]


def paired_task_rows(plan: AblationPlan, results: list[RunResult]) -> list[list[str]]:
    return [[test.arm, test.baseline, ", ".join(map(str, test.seeds)), str(test.pairs), str(test.only_arm),
             str(test.only_baseline), str(test.both), str(test.neither), f"{test.p_value:.3g}"]
            for test in paired_tasks(plan, results)]


def _levels(results: list[RunResult]) -> list[str]:
    """The levels the final validations hold, in order of appearance, then ``all``."""
    seen = {level: None for r in results for level in per_level(r.records) if level != "all"}
    return [*seen, "all"] if seen or any(r.records for r in results) else []


def level_rows(plan: AblationPlan, results: list[RunResult]) -> list[list[str]]:
    """Per arm: the final validation's success per level (mean ± std over the seeds with records)."""
    levels = _levels(results)
    rows = []
    for summary in summarize(plan, results):
        scored = [per_level(r.records) for r in summary.done if r.records]
        if not scored:
            continue
        rows.append([summary.arm, str(len(scored)),
                     *(_mean_sd([s[level] for s in scored if level in s]) for level in levels)])
    return rows


def experience_rows(plan: AblationPlan, results: list[RunResult], env: str) -> list[list[str]]:
    """Per arm whose runs logged them: training success with and without experience in the same groups
    (``exp/success_with_experience`` / ``without``, mean over steps and seeds), the final validation (avg@k,
    mean ± std over seeds) with the share of its episodes that ran with experience, and the final step's
    second pass with another experience mode (``exp_manager.val_compare_mode``) over the seeds that ran one,
    with its paired difference from the first pass."""
    rows = []
    for summary in summarize(plan, results):
        runs = summary.done
        with_ = [r.success_with_experience for r in runs if r.success_with_experience is not None]
        without = [r.success_without_experience for r in runs if r.success_without_experience is not None]
        validation = [r.validation_experience[env] for r in runs if env in r.validation_experience]
        if not with_ and not without:
            continue
        after = summary.values(env, "after")
        share = "" if not validation else f" ({100 * statistics.fmean(validation):.0f}% with experience)"
        second = []
        for mode in sorted({mode for r in runs for mode in r.compared}):
            pairs = [(r.compared[mode][env], r.after(env)) for r in runs
                     if env in r.compared.get(mode, {}) and r.after(env) is not None]
            values = [value for value, _ in pairs]
            diffs = [value - first for value, first in pairs]  # type: ignore[operator]
            seeds = f"{len(pairs)} seed" + ("" if len(pairs) == 1 else "s")
            second.append(f"{mode}: {_mean_sd(values)} (Δ {_mean_sd(diffs, signed=True)}, {seeds})")
        rows.append([summary.arm, _mean_sd(with_), _mean_sd(without), _mean_sd(after) + share,
                     "; ".join(second) or "—"])
    return rows


def synthetic_rows(results: list[RunResult]) -> list[list[str]]:
    """Per run whose task generation ran (``tasks/written`` logged): explorations, tasks proposed and written,
    the synthetic share of the training mixture, and every candidate rejected on the way, by reason
    (:meth:`~agentevolver.module.task_manager.manager.GenerationReport.metrics`)."""
    rows = []
    for r in results:
        tasks = r.tasks
        if "tasks/written" not in tasks:
            continue
        reasons = {key.removeprefix("tasks/rejected/"): value for key, value in tasks.items()
                   if key.startswith("tasks/rejected/")}
        failed = tasks.get("tasks/explorations_failed", 0)
        toolless = tasks.get("tasks/explorations_without_tool_calls", 0)  # absent in runs from before it was logged
        notes = ([f"{failed:.0f} failed"] if failed else []) + ([f"{toolless:.0f} without a tool call"] if toolless else [])
        rows.append([r.run.arm, str(r.run.seed),
                     f"{tasks.get('tasks/explorations', 0):.0f}" + (f" ({', '.join(notes)})" if notes else ""),
                     f"{tasks.get('tasks/proposed', 0):.0f}", f"{tasks['tasks/written']:.0f}",
                     f"{tasks.get('tasks/train_synthetic', 0):.0f} of {tasks.get('tasks/train', 0):.0f}",
                     f"{tasks.get('tasks/rejected', 0):.0f}",
                     ", ".join(f"{reason} {n:.0f}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
                     or "—"])
    return rows


def summarize(plan: AblationPlan, results: list[RunResult]) -> list[ArmSummary]:
    summaries = []
    for arm in plan.arms:
        runs = [r for r in results if r.run.arm == arm.name]
        roles: dict[str, str] = {}
        for result in runs:  # the same for every seed, unless a seed override changed one
            for role, source in result.run.roles.items():
                roles[role] = source if roles.get(role, source) == source else f"{roles[role]} / {source}"
        summaries.append(ArmSummary(arm=arm.name, planned=len(runs), done=[r for r in runs if r.status == "done"],
                                    roles=roles))
    return summaries


# -- formatting -----------------------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _mean_sd(values: list[float], signed: bool = False) -> str:
    if not values:
        return "—"
    mean = 100 * statistics.fmean(values)
    text = f"{mean:+.1f}" if signed else f"{mean:.1f}"
    if len(values) > 1:
        text += f" ± {100 * statistics.stdev(values):.1f}"
    return text


def _machines(machines: list[dict[str, Any]]) -> str:
    """``cpu, N cores, bf16 flag`` per machine; "not recorded" for runs from before attempts recorded one."""
    if not machines:
        return "not recorded"
    return "; ".join(f"{m.get('cpu', 'unknown')}, {m.get('cores', '?')} cores, {m.get('bf16') or 'no bf16 flag'}"
                     for m in machines)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _roles(roles: dict[str, str]) -> str:
    return "; ".join(f"{role}: {source}" for role, source in roles.items()) or "—"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def environments(results: list[RunResult]) -> list[str]:
    return sorted({env for result in results for env in result.avg})


def k_label(results: list[RunResult]) -> str:
    ks = sorted({r.k for r in results if r.k is not None})
    return "/".join(map(str, ks)) if ks else "k"


def arm_rows(plan: AblationPlan, results: list[RunResult], env: str) -> list[list[str]]:
    rows = []
    for summary in summarize(plan, results):
        avg_after, best_after = summary.values(env, "after"), summary.values(env, "best")
        reference = "—" if not avg_after else \
            f"{100 * statistics.fmean(avg_after):.1f} / {100 * statistics.fmean(best_after or avg_after):.1f}"
        wall = summary.wall()
        rows.append([
            summary.arm, f"{len(summary.done)}/{summary.planned}",
            _mean_sd(summary.values(env, "before")), _mean_sd(avg_after), _mean_sd(summary.values(env, "delta"), True),
            reference, _duration(statistics.fmean(wall) if wall else None), _roles(summary.roles),
        ])
    return rows


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it (the report reads the same in any
    checkout of the repository), else as it is."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def render_markdown(plan: AblationPlan, results: list[RunResult], command_line: str) -> str:
    k = k_label(results)
    envs = environments(results)
    lines = [f"# Ablation `{plan.spec.name}`", "",
             f"Training preset `{_shown(plan.spec.conf)}`, ablation file `{_shown(plan.spec_path)}`, seeds "
             f"{', '.join(map(str, plan.seeds))}; {sum(r.status == 'done' for r in results)} of {len(results)} runs "
             f"finished. Updated {now()}.", "",
             "```bash", command_line, "```", ""]
    if not envs:
        lines += ["No validation metrics yet (val-core/<env>/acc/mean@k in the runs' metrics.jsonl).", ""]
    for env in envs:
        lines += [f"## Validation success on `{env}` (%)", "",
                  f"avg@{k} = mean success over the {k} validation sample(s) per task; best@{k} = a task counts if "
                  f"any sample succeeded (best@1 = avg@1). Before = step 0, after = the final step; mean ± sample "
                  f"std over the finished seeds; Δ = after - before per seed, averaged. Wall time: per run, "
                  f"resumed attempts summed.", ""]
        lines += _table(["arm", "runs", f"avg@{k} before", f"avg@{k} after", "Δ", f"avg@{k} / best@{k} after",
                         "wall time / run", "roles"], arm_rows(plan, results, env))
        lines.append("")
        failures = failure_notes(results, env)
        if failures:
            lines += ["**Validation with failed episodes.** An episode a service ended (e.g. the env service "
                      "refused its instance) is scored as a failed task, so these numbers are not the model's "
                      "alone: delete the run's folder and run it again.", "", *failures, ""]
        paired = paired_rows(plan, results, env)
        if paired:
            lines += [f"### Against the baseline, seed by seed (points of avg@{k} after)", "",
                      "Per seed: the arm's final validation minus its baseline's at the same seed (same data "
                      "order, same sampling seed); the mean and Student's t 95% interval over the seeds both "
                      "finished. An interval that contains 0 does not show a difference.", ""]
            lines += _table(["arm", "baseline", "seeds", "mean difference", "95% interval", "per seed"], paired)
            lines.append("")
        experience = experience_rows(plan, results, env)
        if experience:
            lines += ["### Self-Navigating: with and without experience", "",
                      "Training success of the episodes that had experience and of those that had none, in the "
                      "same groups (mean over steps, ± std over seeds); the final validation, with the share of "
                      "its episodes that ran with experience; and the second validation pass on the same final "
                      "weights with another experience mode (`exp_manager.val_compare_mode`, e.g. all = every "
                      "episode with experience), with Δ = second pass - first per seed.", ""]
            lines += _table(["arm", "training success with experience", "without", f"validation avg@{k} after",
                             "second pass after"], experience)
            lines.append("")
    levels = level_rows(plan, results)
    if levels:
        lines += ["## Final validation per task", "",
                  "From each run's per-sample validation dump (`validation/<step>.jsonl`): success per level (mean "
                  "± std over the finished seeds with records), and, for each arm against its baseline, the tasks "
                  "solved by one and not the other over (seed, task) pairs pooled over the seeds both finished. A "
                  "task counts as solved when at least half its samples succeeded (its one sample, with greedy "
                  "validation). p = exact McNemar (two-sided binomial on the discordant pairs).", ""]
        lines += _table(["arm", "seeds", *(f"{level} (%)" for level in _levels(results))], levels)
        lines.append("")
        tasks = paired_task_rows(plan, results)
        if tasks:
            lines += _table(["arm", "baseline", "seeds", "pairs", "arm only", "baseline only", "both", "neither",
                             "McNemar p"], tasks)
            lines.append("")
    synthetic = synthetic_rows(results)
    if synthetic:
        lines += ["## Self-Questioning: synthetic tasks per run", "",
                  "Explorations run before training; tasks proposed (after the writer's own checks, e.g. the "
                  "environment's proof of each answer) and written (after the duplicate and post filters); the "
                  "synthetic tasks in the training mixture; and every candidate dropped on the way, by reason "
                  "(env_*: explorer tool calls the environment writer rendered no task from; answer_*: unproved "
                  "answers; *_duplicate; post_filter; malformed summary items).", ""]
        lines += _table(["arm", "seed", "explorations", "proposed", "written", "synthetic in training",
                         "rejected", "rejected by reason"], synthetic)
        lines.append("")
    lines += ["![validation curves](curves.png)", "", "## Runs", ""]
    run_rows = []
    for r in results:
        env_parts = [f"{env}: {_pct(r.before(env))} → {_pct(r.after(env))}" for env in envs]
        run_rows.append([r.run.arm, str(r.run.seed), r.status, str(r.attempts), "; ".join(env_parts) or "—",
                         _duration(r.wall_s), _machines(r.machines),
                         f"`{os.path.relpath(r.run.run_dir, plan.out)}`"])
    lines += _table(["arm", "seed", "status", "attempts", f"avg@{k} before → after", "wall time", "machine",
                     "run folder"], run_rows)
    lines += ["", "## Arms", ""]
    lines += _table(["arm", "description", "overrides", "services"],
                    [[a.name, a.description or "—", " ".join(f"`{o}`" for o in a.overrides) or "—",
                      ", ".join(dict.fromkeys([*plan.spec.services, *a.services])) or "—"] for a in plan.arms])
    lines += ["", "Every run also gets the shared overrides (the budget): "
              + (" ".join(f"`{o}`" for o in plan.spec.overrides) or "none")
              + "; the seed overrides " + (" ".join(f"`{o}`" for o in plan.spec.seed_overrides) or "none")
              + "; and the command line's " + (" ".join(f"`{o}`" for o in plan.cli_overrides) or "none") + ".", ""]
    budget = plan.runs[0].budget if plan.runs else {}
    if budget:
        lines += ["## Budget", "", "Equal for every arm unless listed below.", ""]
        lines += _table(["key", "value"], [[f"`{key}`", f"`{value}`"] for key, value in budget.items()])
    differences = plan.budget_differences()
    if differences:
        lines += ["", "**Arms differ in budget keys** (not a like-for-like comparison):", ""]
        lines += [f"- `{key}`: " + ", ".join(f"{arm} = `{value}`" for arm, value in values.items())
                  for key, values in differences.items()]
    lines += ["", "## Files", "",
              "- `commands.sh`: the exact launcher command of every run (and of the shared services launch).",
              "- `curves.png`: validation avg@k per arm over training steps (mean over the finished seeds, band ±1 std; "
              "thin lines: each seed, dashed while unfinished).",
              "- `summary.json`: every number above, per run and per arm.",
              "- `runs/<arm>/seed<k>/`: each run's folder (metrics.jsonl, console.log, rollouts/, checkpoints, "
              "ablation_run.json with its attempts); `records/`: the launcher records; `logs/`: launcher output.",
              ""]
    return "\n".join(lines)


def plot_curves(plan: AblationPlan, results: list[RunResult], path: Path) -> None:
    """``curves.png``: one panel per environment, one line per arm (the mean over its finished seeds at each
    validation step, shaded ±1 std where there are two or more), every seed as a thin line (dashed while
    the run is unfinished). The y axis spans the plotted values with 5 points to spare (at least 10 points,
    within 0-100%), so the few points that separate arms stay visible; an axis from 0 to 100 flattened them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    envs = environments(results) or ["(no validation yet)"]
    k = k_label(results)
    fig, axes = plt.subplots(1, len(envs), figsize=(6.4 * len(envs), 4.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, env in zip(axes[0], envs, strict=True):
        plotted: list[float] = []
        for index, arm in enumerate(plan.arms):
            color = colors[index % len(colors)]
            runs = [r for r in results if r.run.arm == arm.name and r.avg.get(env)]
            for r in runs:
                steps = sorted(r.avg[env])
                values = [100 * r.avg[env][s] for s in steps]
                plotted += values
                ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8,
                        linestyle="-" if r.status == "done" else "--")
            finished = [r for r in runs if r.status == "done"]
            steps = sorted({s for r in finished for s in r.avg[env]})
            if not steps:
                continue
            per_step = [[r.avg[env][s] for r in finished if s in r.avg[env]] for s in steps]
            mean = [100 * statistics.fmean(v) for v in per_step]
            sd = [100 * statistics.stdev(v) if len(v) > 1 else 0.0 for v in per_step]
            lower = [m - d for m, d in zip(mean, sd, strict=True)]
            upper = [m + d for m, d in zip(mean, sd, strict=True)]
            plotted += lower + upper
            ax.plot(steps, mean, color=color, marker="o", linewidth=2, label=f"{arm.name} (n={len(finished)})")
            if any(sd):
                ax.fill_between(steps, lower, upper, color=color, alpha=0.15)
        ax.set_title(f"{plan.spec.name}: {env}")
        ax.set_xlabel("training step")
        ax.set_ylabel(f"validation success avg@{k} (%)")
        ax.set_ylim(*_y_range(plotted))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small", title="mean over finished seeds", title_fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _y_range(values: list[float], spare: float = 5.0, least: float = 10.0) -> tuple[float, float]:
    """The y limits of a curves panel: ``values`` (percent) with ``spare`` points either side, at least
    ``least`` wide, clipped to -2..102; the whole range when nothing is plotted."""
    if not values:
        return -2.0, 102.0
    low, high = min(values) - spare, max(values) + spare
    if high - low < least:
        middle = (low + high) / 2
        low, high = middle - least / 2, middle + least / 2
    return max(-2.0, low), min(102.0, high)


def render_commands(plan: AblationPlan, command_line: str) -> str:
    lines = ["#!/usr/bin/env bash",
             f"# Ablation {plan.spec.name!r}: the exact command of every run, in the order they ran.",
             f"#   {command_line}",
             "# Each command is a normal launch (docs/launcher.md): run alone, it starts the services it names and",
             "# stops them at its end. The ablation started them once instead (the services launch below) and every",
             "# run reused them, as a launch reuses a service that already answers.",
             "set -euo pipefail",
             f"cd {shlex.quote(os.getcwd())}", ""]
    if plan.services:
        lines += ["# shared services, held for the whole ablation (blocks until stopped):",
                  "# " + shlex.join(plan.hold_argv), ""]
    for run in plan.runs:
        lines += [f"# {run.arm}, seed {run.seed} -> {run.run_dir}", shlex.join(run.argv), ""]
    return "\n".join(lines)


def summary_json(plan: AblationPlan, results: list[RunResult]) -> dict[str, Any]:
    envs = environments(results)
    arms = []
    for summary in summarize(plan, results):
        per_env = {}
        for env in envs:
            per_env[env] = {which: summary.values(env, which) for which in ("before", "after", "best", "delta")}
            pair = next((p for p in paired_differences(plan, results, env) if p.arm == summary.arm), None)
            if pair is not None:
                per_env[env]["paired"] = {"baseline": pair.baseline, "diffs": pair.diffs, "mean": pair.mean,
                                          "interval95": pair.interval()}
        test = next((t for t in paired_tasks(plan, results) if t.arm == summary.arm), None)
        per_task = None if test is None else {
            "baseline": test.baseline, "seeds": list(test.seeds), "pairs": test.pairs, "only_arm": test.only_arm,
            "only_baseline": test.only_baseline, "both": test.both, "neither": test.neither,
            "mcnemar_p": test.p_value}
        arms.append({"arm": summary.arm, "planned": summary.planned, "done": len(summary.done),
                     "roles": summary.roles, "wall_s": summary.wall(), "validation": per_env,
                     "levels_after": [per_level(r.records) for r in summary.done if r.records],
                     "paired_tasks": per_task})
    runs = [{**r.run.to_json(), "status": r.status, "attempts": r.attempts, "wall_s": r.wall_s, "k": r.k,
             "avg": {env: {str(s): v for s, v in c.items()} for env, c in r.avg.items()},
             "best": {env: {str(s): v for s, v in c.items()} for env, c in r.best.items()},
             "compared_after": r.compared, "tasks": r.tasks, "machines": r.machines,
             "levels_after": per_level(r.records)} for r in results]
    return {"name": plan.spec.name, "updated": now(), "arms": arms, "runs": runs,
            "budget_differences": plan.budget_differences()}


def write_report(plan: AblationPlan, command_line: str) -> list[RunResult]:
    """Write README.md, curves.png, commands.sh and summary.json into the ablation folder."""
    results = collect(plan)
    plan.out.mkdir(parents=True, exist_ok=True)
    (plan.out / "README.md").write_text(render_markdown(plan, results, command_line), encoding="utf-8")
    plot_curves(plan, results, plan.out / "curves.png")
    commands = plan.out / "commands.sh"
    commands.write_text(render_commands(plan, command_line), encoding="utf-8")
    commands.chmod(0o755)
    (plan.out / "summary.json").write_text(json.dumps(summary_json(plan, results), indent=2), encoding="utf-8")
    return results
