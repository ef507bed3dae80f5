"""Summarisation: episodes in, validated experiences upserted into a workspace (ReMe's summary pipeline).

Steps, per request:

1. group the episodes by ``task_id`` and split each group at ``success_threshold`` into successes and
   failures;
2. ask the summariser LLM (sending the reply's schema as ``response_format`` where the endpoint takes
   it), concurrently, for experiences from the best successes (what made them work),
   the worst failures (what to avoid) and, per task, a comparison of its best and worst episode (what made
   the difference; also between two successes or two failures whose scores differ by
   ``soft_comparison_gap``);
3. validate every candidate with the LLM and keep those scoring >= ``validation_threshold``;
4. embed the keepers' ``when_to_use``, drop near-duplicates of what the workspace (or this request)
   already holds, and upsert the rest in one transaction.

A request with ``experience_kind: exemplar`` takes none of these steps: it stores each task's best solved
episode whole, with no LLM (:mod:`.exemplar_summary`).

An LLM that cannot be reached fails the request (502, nothing stored; the client may retry); a reply that
cannot be read only loses that one extraction or candidate, counted in ``stats.unparsable_replies``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from agentevolver.client.llm_client import LLMClient
from agentevolver.client.structured_output import ReplySchema
from agentevolver.embedders import Embedder
from agentevolver.errors import LLMError
from agentevolver.memory_service import prompts
from agentevolver.memory_service.errors import LLMFailed, LLMNotConfigured
from agentevolver.memory_service.exemplar_summary import ExemplarSummarizer
from agentevolver.memory_service.settings import SummarySettings
from agentevolver.memory_service.store import VectorStore
from agentevolver.schema.memory_wire import (
    EXEMPLAR,
    RejectedMemory,
    SummaryMetadata,
    SummaryRequest,
    SummaryResponse,
    SummaryStats,
    TaskMemory,
    TrajectoryIn,
)

__all__ = ["Summarizer"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(slots=True)
class _Job:
    """One extraction request to the LLM and where its experiences come from."""

    source: str  # success | failure | comparison
    task_id: str
    task: str
    system: str
    user: str
    scores: list[float]


@dataclass(slots=True)
class _Proposal:
    candidate: prompts.Candidate
    job: _Job
    validation_score: float | None = None
    validation_reason: str = ""


@dataclass(slots=True)
class _Run:
    """Counters of one request."""

    stats: SummaryStats
    rejected: list[RejectedMemory] = field(default_factory=list)


async def _all(calls: Iterable[Awaitable[_T]]) -> list[_T]:
    """Await every call, then raise the first failure: no call is left running or unobserved."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


class Summarizer:
    """Turns a :class:`SummaryRequest` into stored experiences. One per service; safe for concurrent requests."""

    def __init__(self, settings: SummarySettings, llm: LLMClient | None, embedder: Embedder,
                 store: VectorStore) -> None:
        self.settings = settings
        self.llm = llm
        self.embedder = embedder
        self.store = store
        self._workspace_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # Shares the workspace locks: an exemplar write and an advice write never interleave in one workspace.
        self.exemplars = ExemplarSummarizer(settings, embedder, store, self._workspace_locks)

    async def summarize(self, request: SummaryRequest) -> SummaryResponse:
        if request.experience_kind == EXEMPLAR:  # no LLM needed: checked before the LLM is required
            return await self.exemplars.summarize(request)
        if self.llm is None:
            raise LLMNotConfigured(
                "summarising needs an LLM, and this memory service was started without one: start it with "
                "--llm-base-url and --llm-model, or an llm section (with an exp_summarizer role) in --config"
            )
        groups = self._group(request.trajectories)
        s = self.settings
        run = _Run(SummaryStats(trajectories=len(request.trajectories), tasks=len(groups)))
        jobs: list[_Job] = []
        for task_id, episodes in groups.items():
            successes = [t for t in episodes if t.score >= s.success_threshold]
            failures = [t for t in episodes if t.score < s.success_threshold]
            run.stats.successes += len(successes)
            run.stats.failures += len(failures)
            jobs.extend(self._jobs(task_id, successes, failures))

        proposals = [p for found in await _all(self._extract(job, run) for job in jobs) for p in found]
        proposals = self._unique(proposals)
        run.stats.extracted = len(proposals)
        if s.validation_threshold > 0:
            proposals = await self._validate(proposals, run)

        stored = await self._store(request.workspace_id, proposals, run)
        run.stats.stored = len(stored)
        run.stats.rejected = len(run.rejected)
        answer = (
            f"stored {len(stored)} experience(s) from {run.stats.trajectories} trajectories of "
            f"{run.stats.tasks} task(s); {run.stats.extracted} extracted, {run.stats.rejected} not stored"
        )
        logger.info("workspace %s: %s", request.workspace_id, answer)
        return SummaryResponse(
            answer=answer, metadata=SummaryMetadata(memory_list=stored, rejected=run.rejected, stats=run.stats)
        )

    # ------------------------------------------------------------------ planning
    @staticmethod
    def _group(trajectories: list[TrajectoryIn]) -> dict[str, list[TrajectoryIn]]:
        groups: dict[str, list[TrajectoryIn]] = {}
        for trajectory in trajectories:
            groups.setdefault(trajectory.task_id, []).append(trajectory)
        return groups

    def _render(self, trajectory: TrajectoryIn, max_chars: int | None = None) -> str:
        s = self.settings
        return prompts.render_trajectory(
            trajectory.messages, max_chars=max_chars or s.max_trajectory_chars, max_message_chars=s.max_message_chars
        )

    def _jobs(self, task_id: str, successes: list[TrajectoryIn], failures: list[TrajectoryIn]) -> list[_Job]:
        s = self.settings
        episodes = successes + failures
        task = prompts.task_text(episodes[0].messages)
        fmt = {"n": s.max_experiences_per_reply}
        jobs = [
            _Job("success", task_id, task, prompts.SUCCESS_SYSTEM.format(**fmt),
                 f"Score of this attempt: {t.score:g}\n\nAttempt:\n{self._render(t)}", [t.score])
            for t in sorted(successes, key=lambda t: -t.score)[: s.max_successes_per_task]
        ]
        jobs += [
            _Job("failure", task_id, task, prompts.FAILURE_SYSTEM.format(**fmt),
                 f"Score of this attempt: {t.score:g}\n\nAttempt:\n{self._render(t)}", [t.score])
            for t in sorted(failures, key=lambda t: t.score)[: s.max_failures_per_task]
        ]
        if s.enable_comparison and len(episodes) >= 2:
            best = max(episodes, key=lambda t: t.score)
            worst = min(episodes, key=lambda t: t.score)
            hard = best.score >= s.success_threshold > worst.score
            soft = s.soft_comparison_gap is not None and best.score - worst.score >= s.soft_comparison_gap
            if best is not worst and (hard or soft):
                half = s.max_trajectory_chars // 2
                jobs.append(_Job(
                    "comparison", task_id, task, prompts.COMPARISON_SYSTEM.format(**fmt),
                    f"Better attempt (score {best.score:g}):\n{self._render(best, half)}\n\n"
                    f"Worse attempt (score {worst.score:g}):\n{self._render(worst, half)}",
                    [best.score, worst.score],
                ))
        return jobs

    # ------------------------------------------------------------------ LLM steps
    async def _ask(self, system: str, user: str, run: _Run, schema: ReplySchema) -> str:
        """One LLM call; ``schema`` is sent as ``response_format`` where the endpoint takes it."""
        assert self.llm is not None
        run.stats.llm_calls += 1
        try:
            result = await self.llm.achat([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                          schema=schema)
        except LLMError as err:
            raise LLMFailed(f"the summariser LLM failed, nothing was stored: {err}") from err
        return result.text

    async def _extract(self, job: _Job, run: _Run) -> list[_Proposal]:
        reply = await self._ask(job.system, job.user, run,
                                prompts.extraction_schema(self.settings.max_experiences_per_reply))
        found = prompts.parse_experiences(reply, self.settings.max_experiences_per_reply)
        if found is None:
            run.stats.unparsable_replies += 1
            logger.warning("%s extraction of task %r: reply holds no JSON array: %.200r", job.source, job.task_id,
                           reply)
            return []
        return [_Proposal(candidate, job) for candidate in found]

    @staticmethod
    def _unique(proposals: list[_Proposal]) -> list[_Proposal]:
        seen: set[tuple[str, str]] = set()
        unique = []
        for proposal in proposals:
            key = (proposal.candidate.when_to_use.casefold(), proposal.candidate.content.casefold())
            if key not in seen:
                seen.add(key)
                unique.append(proposal)
        return unique

    async def _validate(self, proposals: list[_Proposal], run: _Run) -> list[_Proposal]:
        threshold = self.settings.validation_threshold

        async def check(proposal: _Proposal) -> bool:
            c = proposal.candidate
            task = prompts.cut(proposal.job.task, 1500) if proposal.job.task else "(unknown)"
            reply = await self._ask(
                prompts.VALIDATION_SYSTEM,
                f"Task it was learnt from: {task}\nLearnt from: a {proposal.job.source} "
                f"(scores {', '.join(f'{x:g}' for x in proposal.job.scores)})\n\n"
                f"When to use: {c.when_to_use}\nAdvice: {c.content}",
                run, prompts.VALIDATION_SCHEMA,
            )
            verdict = prompts.parse_validation(reply)
            if verdict is None:
                run.stats.unparsable_replies += 1
                self._reject(run, proposal, "the validation reply held no {score, reason} JSON")
                return False
            proposal.validation_score, proposal.validation_reason = verdict
            if proposal.validation_score < threshold:
                self._reject(run, proposal, f"validation score {proposal.validation_score:g} < threshold {threshold:g}"
                             + (f": {proposal.validation_reason}" if proposal.validation_reason else ""))
                return False
            return True

        keep = await _all(check(p) for p in proposals)
        return [p for p, ok in zip(proposals, keep, strict=True) if ok]

    @staticmethod
    def _reject(run: _Run, proposal: _Proposal, reason: str) -> None:
        run.rejected.append(RejectedMemory(when_to_use=proposal.candidate.when_to_use,
                                           content=proposal.candidate.content, reason=reason,
                                           validation_score=proposal.validation_score))

    # ------------------------------------------------------------------ storing
    def _memory(self, workspace_id: str, proposal: _Proposal) -> TaskMemory:
        job = proposal.job
        metadata: dict[str, Any] = {"task_id": job.task_id, "source": job.source, "task": prompts.cut(job.task, 500),
                                    "trajectory_scores": job.scores}
        if proposal.validation_score is not None:
            metadata["validation_reason"] = proposal.validation_reason
        return TaskMemory(workspace_id=workspace_id, when_to_use=proposal.candidate.when_to_use,
                          content=proposal.candidate.content,
                          score=proposal.validation_score if proposal.validation_score is not None else 0.0,
                          author=self.llm.model if self.llm is not None else "", metadata=metadata)

    async def _store(self, workspace_id: str, proposals: list[_Proposal], run: _Run) -> list[TaskMemory]:
        if not proposals:
            return []
        vectors = await asyncio.to_thread(self.embedder.embed, [p.candidate.when_to_use for p in proposals])
        threshold = self.settings.dedup_threshold
        async with self._workspace_locks[workspace_id]:  # dedup check and write see the same workspace
            keep: list[int] = []
            for i, proposal in enumerate(proposals):
                if threshold is not None:
                    hits = await asyncio.to_thread(self.store.search, workspace_id, vectors[i], 1)
                    if hits and hits[0].similarity >= threshold:
                        run.stats.duplicates += 1
                        self._reject(run, proposal, f"duplicate of stored memory {hits[0].memory.memory_id} "
                                     f"(similarity {hits[0].similarity:.3f} >= dedup_threshold {threshold:g})")
                        continue
                    if keep and float(np.max(vectors[keep] @ vectors[i])) >= threshold:
                        run.stats.duplicates += 1
                        self._reject(run, proposal, "duplicate of another experience of this request")
                        continue
                keep.append(i)
            memories = [self._memory(workspace_id, proposals[i]) for i in keep]
            await asyncio.to_thread(self.store.upsert, workspace_id, memories, vectors[keep])
        return memories
