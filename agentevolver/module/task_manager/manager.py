"""The task manager: seed tasks -> explore -> summarise -> filter -> synthetic tasks; and the mixtures.

``generate_task`` (seed 000, chapter 2) runs ``n`` explorations per seed task. They run in batches of
``min(num_explore_threads, number of seed tasks)`` that never hold the same seed twice, so one task is
never explored twice at once (concurrent explorations of one seed tend to write the same tasks). Each
finished exploration passes the real-time filters against everything kept so far for its seed and is
recorded in the checkpoint at once (:mod:`.checkpoint`), so a killed run resumes without redoing it.
Then the post filters judge every kept task (verdicts cached in the checkpoint too), and the survivors
are written to ``synthetic_tasks_path``. ``n: 0`` returns at once: nothing explored, no LLM request.

Failures are counted, not fatal: an unparseable summary yields no tasks (recorded, not retried on
resume); an exploration whose environment or LLM failed is *not* recorded, so the next run retries it;
:class:`GenerationReport` lists both, and the rates the run's summary table shows.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.client.llm_client import LLMClients
from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.embedders import EMBEDDERS, normalize_text
from agentevolver.errors import ConfigError, LLMError
from agentevolver.module.task_manager.checkpoint import (
    ExplorationRecord,
    GenerationCheckpoint,
    explorations_log_path,
    inputs_digest,
)
from agentevolver.module.task_manager.deps import ROLE_EXPLORER, ROLE_SUMMARIZER, TaskManagerDeps
from agentevolver.module.task_manager.env_writer import EnvWriter
from agentevolver.module.task_manager.eval_overlap import overlap
from agentevolver.module.task_manager.exploration import EXPLORATION_STRATEGIES, ExplorationStrategy
from agentevolver.module.task_manager.filters import (
    POST_FILTERS,
    REALTIME_FILTERS,
    PostFilter,
    RealtimeFilter,
)
from agentevolver.module.task_manager.graders import GRADERS
from agentevolver.module.task_manager.mixture import MIXTURES, MixtureStrategy
from agentevolver.module.task_manager.profile import EnvProfile
from agentevolver.module.task_manager.prompts import PROMPT_VERSION
from agentevolver.module.task_manager.store import write_objectives
from agentevolver.module.task_manager.summarizer import Summarizer, llm_writer_identity
from agentevolver.schema import Task, TaskObjective
from agentevolver.schema.task_writing import RENDER_COUNTS

__all__ = ["GenerationReport", "ProgressFn", "TaskManager", "TaskWriter", "check_names", "exploration_key",
           "make_writer", "writer_identity"]

logger = logging.getLogger(__name__)

#: A task writer (``task_manager.writer``): the LLM summariser or the environment's profile.
TaskWriter = Summarizer | EnvWriter

#: ``progress(phase, done, total)``; phase is "explore" or "filter".
ProgressFn = Callable[[str, int, int], None]


#: The environment writer's counts of tool calls that gave no task (every :data:`RENDER_COUNTS` but the seen and
#: rendered totals), each a rejection reason in :meth:`GenerationReport.metrics`.
ENV_DROPPED_COUNTS = tuple(key for key in RENDER_COUNTS if key not in ("calls_seen", "tasks_rendered"))


def exploration_key(seed_task_id: str, round_index: int) -> str:
    return f"{seed_task_id}#{round_index}"


@dataclass
class GenerationReport:
    """What a generation run produced and what happened on the way (counters summed over explorations,
    resumed ones included)."""

    objectives: list[TaskObjective] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    checkpoint_status: str = "off"
    output_path: Path | None = None
    #: who wrote the tasks (``task_manager.writer``): "llm: <model> (...)" or "env: ..." (see :func:`writer_identity`)
    writer: str = ""
    #: written tasks by the level the environment wrote them at (``metadata.level``; tasks without one uncounted)
    levels: Counter[str] = field(default_factory=Counter)
    #: the evaluation splits the written tasks were compared with (``task_manager.eval_splits`` the env has)
    eval_splits: list[str] = field(default_factory=list)

    def rates(self) -> dict[str, float | None]:
        """parse rate (summariser replies that parsed), re-asks per exploration, structured share (replies
        generated under the reply schema), proof rate (written tasks whose answer the environment's
        observations proved; grounded profiles), duplicate rate (proved tasks the real-time filters dropped as
        duplicates), feasibility rate (judged tasks the post filters kept); None when undefined."""
        c = self.counts
        duplicates = c["dropped_exact_duplicate"] + c["dropped_near_duplicate"]
        summarised = c["explorations_planned"] - self.failed_explorations()
        return {
            "parse_rate": _ratio(c["summary_replies"] - c["summary_unparsed_replies"], c["summary_replies"]),
            "reasks_per_exploration": (_ratio(c["summary_replies"] - summarised, summarised)
                                       if c["summary_replies"] else None),
            "structured_share": _ratio(c["summary_structured_replies"], c["summary_replies"]),
            "proof_rate": _ratio(c["answers_proved"], c["answers_checked"]),
            "duplicate_rate": _ratio(duplicates, c["objectives_proposed"]),
            "feasibility_rate": _ratio(c["judged_kept"], c["judged"]),
        }

    def failed_explorations(self) -> int:
        """Explorations that failed (their failure is keyed ``seed#round``; a post-filter failure is keyed
        ``filter:task``)."""
        return sum(1 for f in self.failures if "#" in f.split(":", 1)[0])

    def rejections(self) -> dict[str, int]:
        """Written tasks whose answer was not proved, by reason (:data:`.proof.REJECTION_REASONS`)."""
        prefix = "answers_rejected_"
        return {key.removeprefix(prefix): value for key, value in sorted(self.counts.items())
                if key.startswith(prefix) and value}

    def metrics(self) -> dict[str, float]:
        """The generation as ``tasks/*`` metrics: what was written and every candidate dropped on the way, by
        reason (``tasks/rejected/<reason>``), so a run's metrics.jsonl (and the ablation report that reads it)
        says how Self-Questioning fed training without its log or checkpoint. Reasons, in funnel order: the
        environment writer's tool calls it did not render (``env_<count>``, :data:`RENDER_COUNTS`), malformed
        summary items, unproved answers (``answer_<reason>``), the real-time filters' drops by reason (duplicates,
        ``eval_overlap``), post-filter rejections. Then what was written: distinct queries, the level mix
        (``tasks/level/<level>``) and the written tasks equal to an evaluation task (``tasks/eval_overlap``, 0 when
        the ``eval_overlap`` filter ran)."""
        c = self.counts
        rejected = {f"env_{key}": c[f"env_{key}"] for key in ENV_DROPPED_COUNTS}
        rejected["malformed"] = c["summary_rejected_items"]
        rejected.update({f"answer_{reason}": n for reason, n in self.rejections().items()})
        rejected.update({key.removeprefix("dropped_"): n for key, n in sorted(c.items()) if key.startswith("dropped_")})
        rejected["post_filter"] = c["judged"] - c["judged_kept"]
        metrics = {"tasks/explorations": c["explorations_planned"],
                   "tasks/explorations_failed": self.failed_explorations(),
                   "tasks/explorations_without_tool_calls": c["explore_without_tool_calls"],
                   "tasks/proposed": c["objectives_proposed"], "tasks/written": c["tasks_written"],
                   "tasks/distinct": c["tasks_distinct"], "tasks/rejected": sum(rejected.values())}
        metrics.update({f"tasks/rejected/{reason}": n for reason, n in rejected.items() if n})
        metrics.update({f"tasks/level/{level}": n for level, n in sorted(self.levels.items())})
        if self.eval_splits:
            metrics["tasks/eval_overlap"] = c["eval_overlap_written"]
        return {key: float(value) for key, value in metrics.items()}


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


class TaskManager:
    """Self-Questioning for one environment (see the module docstring).

    The trainer builds two: ``mixture`` ``unified`` for training and ``original_only`` for validation.
    """

    def __init__(self, deps: TaskManagerDeps, mixture: MixtureStrategy | None = None) -> None:
        self.deps = deps
        self.section = deps.section
        check_names(deps.settings)
        self.mixture = mixture or MIXTURES.create(self.section.mixture.strategy, self.section.mixture)

    @classmethod
    def from_settings(cls, settings: AgentEvolverSettings, *, env: EnvClient | None = None,
                      llm: LLMClients | None = None, mixture: str | None = None,
                      profile: EnvProfile | None = None) -> TaskManager:
        """A manager for ``settings`` (``mixture`` overrides the configured strategy, e.g. ``original_only``)."""
        deps = TaskManagerDeps(settings=settings, env=env, llm=llm, given_profile=profile)
        strategy = MIXTURES.create(mixture, settings.task_manager.mixture) if mixture else None
        return cls(deps, strategy)

    # ------------------------------------------------------------------ mixture
    def mix(self, original: Sequence[TaskObjective], synthetic: Sequence[TaskObjective]) -> list[TaskObjective]:
        """The dataset's tasks by this manager's mixture strategy."""
        return self.mixture.mix(original, synthetic)

    # ------------------------------------------------------------------ generation
    def inputs(self, seeds: Sequence[Task]) -> dict[str, Any]:
        """What the explorations depend on (the checkpoint's digest; see :mod:`.checkpoint`)."""
        settings, section = self.deps.settings, self.section
        return {
            "prompt_version": PROMPT_VERSION,
            "env_type": self.deps.env_type,
            "create_params": self.deps.exploration_params,
            "seeds": [s.model_dump(mode="json") for s in seeds],
            "strategy": section.strategy,
            "max_explore_step": section.max_explore_step,
            "explorer_temperature": section.explorer_temperature,
            "explorer_max_tokens": section.explorer_max_tokens,
            # only when not the default, so checkpoints written before the key existed still resume
            **({"explorer_tool_choice": section.explorer_tool_choice}
               if section.explorer_tool_choice != "auto" else {}),
            "explore_seed": section.explore_seed,
            "eval_splits": section.eval_splits,
            "tasks_per_exploration": section.tasks_per_exploration,
            "writer_all_renderings": section.writer_all_renderings,
            "parse_retries": section.parse_retries,
            "demonstrations": section.demonstrations,
            "max_observation_chars": section.max_observation_chars,
            "realtime_filters": section.realtime_filters,
            "dedup": section.dedup.model_dump(),
            "synthetic_grader": section.grader.synthetic_grader,
            "tool_parser": settings.agent_flow.tools.tool_parser,
            "profile": self.deps.profile.digest_form(),
            "explorer": _model_identity(settings, ROLE_EXPLORER),
            # the writer (task_manager.writer): the LLM's identity, or "env" (the profile, above, says how)
            "summarizer": _model_identity(settings, ROLE_SUMMARIZER) if section.writer == "llm" else {"writer": "env"},
        }

    def generate_task(self, seeds: Sequence[Task], *, progress: ProgressFn | None = None,
                      output_path: str | Path | None = None) -> GenerationReport:
        """Generate synthetic tasks from ``seeds`` and write them to ``output_path`` (default: the configured
        ``synthetic_tasks_path``). Raises only for configuration errors (unknown names, unreadable profile)."""
        section = self.section
        report = GenerationReport(writer=writer_identity(self.deps.settings))
        if section.n == 0 or not seeds:
            logger.info("task synthesis is off (task_manager.n=0 or no seed tasks)")
            return report
        summarizer = make_writer(self.deps)  # first: writer env on an environment that cannot write tasks fails here
        report.writer = summarizer.identity()
        strategy = EXPLORATION_STRATEGIES.create(section.strategy, self.deps)
        realtime = [REALTIME_FILTERS.create(name, self.deps) for name in section.realtime_filters]
        post = [(name, POST_FILTERS.create(name, self.deps)) for name in section.post_filters]
        verdict_inputs = {"filters": [[n, f.fingerprint] for n, f in post], "retries": section.parse_retries,
                          "demonstrations": section.demonstrations,
                          "prompt_version": PROMPT_VERSION, "profile": self.deps.profile.digest_form()}
        checkpoint = GenerationCheckpoint.open(section.checkpoint_path, inputs_digest(self.inputs(seeds)),
                                               inputs_digest(verdict_inputs))
        report.checkpoint_status = checkpoint.status
        plan = [(seed, r) for r in range(section.n) for seed in seeds]
        self._explore_all(plan, strategy, summarizer, realtime, checkpoint, report, progress)
        candidates = [o for seed, r in plan if (rec := checkpoint.explorations.get(exploration_key(seed.task_id, r)))
                      for o in rec.objectives]
        for record in (checkpoint.explorations.get(exploration_key(s.task_id, r)) for s, r in plan):
            if record is not None:
                report.counts.update(record.counts)
        report.objectives = self._post_filter(candidates, post, checkpoint, report, progress)
        report.output_path = write_objectives(output_path or section.synthetic_tasks_path, report.objectives)
        self._describe_written(report)
        return report

    def _describe_written(self, report: GenerationReport) -> None:
        """What was written: how many, how many distinct, at which levels, how many equal an evaluation task."""
        written = report.objectives
        report.counts["tasks_written"] = len(written)
        report.counts["tasks_distinct"] = len({normalize_text(o.task.query or "") for o in written})
        report.levels = Counter(str(level) for o in written if (level := o.task.metadata.get("level")))
        if self.section.eval_splits:
            report.counts["eval_overlap_written"] = overlap(written, self.deps.eval_queries)
            report.eval_splits = list(self.deps.eval_queries.splits)

    def _explore_all(self, plan: list[tuple[Task, int]], strategy: ExplorationStrategy, summarizer: TaskWriter,
                     realtime: list[RealtimeFilter], checkpoint: GenerationCheckpoint, report: GenerationReport,
                     progress: ProgressFn | None) -> None:
        pending = [(s, r) for s, r in plan if exploration_key(s.task_id, r) not in checkpoint.explorations]
        report.counts["explorations_planned"] = len(plan)
        report.counts["explorations_resumed"] = len(plan) - len(pending)
        done = len(plan) - len(pending)
        if progress:
            progress("explore", done, len(plan))
        parallel = min(self.section.num_explore_threads, len({s.task_id for s, _ in plan}))
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="explore") as pool:
            for batch in _batches(pending, parallel):
                futures: dict[Future[ExplorationRecord], tuple[Task, int]] = {
                    pool.submit(self._explore_and_summarize, strategy, summarizer, seed, r): (seed, r)
                    for seed, r in batch}
                for future in as_completed(futures):
                    seed, r = futures[future]
                    key = exploration_key(seed.task_id, r)
                    try:
                        record = future.result()
                    except (EnvClientError, LLMError) as err:
                        logger.warning("exploration %s failed (it will be retried by the next run): %s", key, err)
                        report.failures.append(f"{key}: {err}")
                    else:
                        self._keep(record, realtime, checkpoint)
                        checkpoint.save()
                        self._log_exploration(record)
                        report.counts["explorations_run"] += 1
                    done += 1
                    if progress:
                        progress("explore", done, len(plan))

    def _explore_and_summarize(self, strategy: ExplorationStrategy, summarizer: TaskWriter, seed: Task,
                               round_index: int) -> ExplorationRecord:
        """One exploration and its summary (runs in a worker thread)."""
        trajectory = strategy.explore(seed, round_index)
        summary = summarizer.summarize(seed, trajectory)
        opening = int(trajectory.metadata.get("opening_len", 0))
        tool_calls = sum(len(m.tool_calls or []) for m in trajectory.messages[opening:] if m.role == "assistant")
        counts = {
            "explore_steps": trajectory.num_steps,
            # the tool calls the explorer made; an exploration of an environment with tools that made none
            # (text only: no call the writer could render) is counted apart (text-action environments are not)
            "explore_tool_calls": tool_calls,
            "explore_without_tool_calls": int(tool_calls == 0 and bool(trajectory.metadata.get("tools_offered"))),
            "summary_replies": summary.replies,
            "summary_unparsed_replies": summary.unparsed_replies,
            "summary_structured_replies": summary.structured_replies,
            "summary_format_fallbacks": summary.format_fallbacks,
            "summaries_failed": int(not summary.parsed),
            "summary_rejected_items": summary.rejected_items,
            "objectives_proposed": len(summary.objectives),
            **{f"answers_{key}": value for key, value in summary.proofs.items()},
            **{f"env_{key}": value for key, value in (summary.rendered or {}).items()},
        }
        if not summary.parsed:
            logger.info("exploration %s: no summary reply parsed (%s)", exploration_key(seed.task_id, round_index),
                        "; ".join(summary.errors))
        return ExplorationRecord(key=exploration_key(seed.task_id, round_index), seed_task_id=seed.task_id,
                                 round=round_index, objectives=summary.objectives, counts=counts,
                                 trajectory=trajectory)

    def _log_exploration(self, record: ExplorationRecord) -> None:
        """Append the finished exploration to the explorations log (``task_manager.save_explorations``): what the
        explorer said and called, what the environment answered, the writer's counters and the tasks kept, so
        why an exploration wrote nothing can be read afterwards (the checkpoint keeps only counters and tasks).
        A log that cannot be written is a warning: the generation goes on."""
        if not self.section.save_explorations or record.trajectory is None:
            return
        path = explorations_log_path(self.section.checkpoint_path)
        line = {"key": record.key, "seed_task_id": record.seed_task_id, "round": record.round,
                "counts": record.counts, "tasks": [o.task.query for o in record.objectives],
                "trajectory": record.trajectory.model_dump(mode="json")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        except OSError as err:
            logger.warning("exploration %s: not written to the explorations log %s: %s", record.key, path, err)

    @staticmethod
    def _keep(record: ExplorationRecord, realtime: list[RealtimeFilter], checkpoint: GenerationCheckpoint) -> None:
        """Run the real-time filters against what this seed already has, then record the exploration."""
        existing = [o for other in checkpoint.explorations.values() if other.seed_task_id == record.seed_task_id
                    for o in other.objectives]
        kept = record.objectives
        for rt_filter in realtime:
            result = rt_filter.filter(kept, existing)
            kept = result.kept
            for dropped in result.dropped:
                record.counts[f"dropped_{dropped.reason}"] = record.counts.get(f"dropped_{dropped.reason}", 0) + 1
        record.objectives = kept
        record.counts["objectives_kept"] = len(kept)
        checkpoint.explorations[record.key] = record

    def _post_filter(self, objectives: list[TaskObjective], post: list[tuple[str, PostFilter]],
                     checkpoint: GenerationCheckpoint, report: GenerationReport,
                     progress: ProgressFn | None) -> list[TaskObjective]:
        """Judge every objective with each post filter in turn (cached verdicts reused); keep the survivors."""
        survivors = objectives
        threads = self.section.num_explore_threads
        for name, post_filter in post:
            todo = [o for o in survivors if f"{name}:{o.task.task_id}" not in checkpoint.verdicts]
            done = len(survivors) - len(todo)
            if progress:
                progress("filter", done, len(survivors))
            with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="judge") as pool:
                futures = {pool.submit(post_filter.judge, o): o for o in todo}
                for future in as_completed(futures):
                    objective = futures[future]
                    try:
                        verdict = future.result()
                    except (EnvClientError, LLMError) as err:
                        logger.warning("post filter %s failed on %s (kept out of this run's output; retried by "
                                       "the next run): %s", name, objective.task.task_id, err)
                        report.failures.append(f"{name}:{objective.task.task_id}: {err}")
                    else:
                        checkpoint.verdicts[f"{name}:{objective.task.task_id}"] = {
                            "keep": verdict.keep, "reason": verdict.reason, "unparsed": verdict.unparsed,
                            "replies": verdict.replies, "without_llm": verdict.without_llm}
                        checkpoint.save()
                    done += 1
                    if progress:
                        progress("filter", done, len(survivors))
            kept = []
            for objective in survivors:
                verdict = checkpoint.verdicts.get(f"{name}:{objective.task.task_id}")
                if verdict is None:
                    continue
                report.counts["judged"] += 1
                report.counts["judge_replies"] += int(verdict.get("replies", 0))
                report.counts["judged_without_llm"] += bool(verdict.get("without_llm"))
                if verdict.get("unparsed"):
                    report.counts["judged_unparsed"] += 1
                if verdict["keep"]:
                    report.counts["judged_kept"] += 1
                    kept.append(objective)
            survivors = kept
        return survivors


def check_names(settings: AgentEvolverSettings) -> None:
    """Import ``task_manager.plugin_modules``, then check that every configured name is registered, so a typo
    fails at start-up with the key and the choices, not after an hour of exploration."""
    section = settings.task_manager
    for module in section.plugin_modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ConfigError(f"task_manager.plugin_modules: cannot import {module!r} ({err}); give an importable "
                              "module path such as 'my_project.task_plugins'") from err
    EXPLORATION_STRATEGIES.check(section.strategy)
    for index, name in enumerate(section.realtime_filters):
        REALTIME_FILTERS.check(name, f"task_manager.realtime_filters[{index}]")
    for index, name in enumerate(section.post_filters):
        POST_FILTERS.check(name, f"task_manager.post_filters[{index}]")
    EMBEDDERS.check(section.dedup.embedder, "task_manager.dedup.embedder")
    MIXTURES.check(section.mixture.strategy)
    GRADERS.check(section.grader.original_grader, "task_manager.grader.original_grader")
    if section.grader.synthetic_grader != "auto":  # auto: reference or llm, by the profile (deps.synthetic_grader)
        GRADERS.check(section.grader.synthetic_grader, "task_manager.grader.synthetic_grader")


def make_writer(deps: TaskManagerDeps) -> TaskWriter:
    """The task writer ``task_manager.writer`` names: ``llm`` = the task_summarizer role reads the masked
    exploration; ``env`` = the environment service renders it (capability ``task_writing``; a :class:`ConfigError`
    naming the key when the environment does not offer it or the profile declares no ``answers``)."""
    return EnvWriter(deps) if deps.section.writer == "env" else Summarizer(deps)


def writer_identity(settings: AgentEvolverSettings) -> str:
    """Who writes the tasks, from the settings alone (the report of a run that generates nothing says it too)."""
    if settings.task_manager.writer == "env":
        return f"env: the {settings.env_service.env_type} environment renders the exploration's tool calls (no LLM)"
    return llm_writer_identity(settings)


def _batches(pending: list[tuple[Task, int]], size: int) -> list[list[tuple[Task, int]]]:
    """Consecutive batches of at most ``size`` explorations with no seed task twice in one batch."""
    batches: list[list[tuple[Task, int]]] = []
    remaining = list(pending)
    while remaining:
        batch: list[tuple[Task, int]] = []
        seen: set[str] = set()
        rest: list[tuple[Task, int]] = []
        for item in remaining:
            if len(batch) < size and item[0].task_id not in seen:
                batch.append(item)
                seen.add(item[0].task_id)
            else:
                rest.append(item)
        batches.append(batch)
        remaining = rest
    return batches


def _model_identity(settings: AgentEvolverSettings, role: str) -> dict[str, Any]:
    """What of a role's endpoint changes its replies (not its URL or timeouts: moving a server is no change)."""
    _name, endpoint = settings.llm.endpoint_for(role)
    return {"model": endpoint.model, "temperature": endpoint.temperature, "max_tokens": endpoint.max_tokens}
