"""Summarisation in exemplar mode: solved episodes are stored whole as worked examples; no LLM is asked.

Per request (``experience_kind: exemplar``):

1. group the episodes by task (``task_id``; by the task's text where none is sent, since each exemplar
   stands for one task);
2. keep, per task, the best solved episode: score >= ``summary.success_threshold``, then the highest score,
   then the fewest messages (a short worked example is the clearer one); unsolved episodes are counted as
   failures and never stored;
3. one task, one exemplar: an exemplar whose ``when_to_use`` is the same task text is replaced when the new
   episode is better by the same order, and otherwise kept (the new one counts as a duplicate). Near
   duplicates by embedding similarity are *not* merged as advice is: "What is 12 * 31?" and
   "What is 12 * 32?" embed almost identically but are different worked examples;
4. embed the task texts and upsert in one transaction.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass

from agentevolver.embedders import Embedder
from agentevolver.memory_service.exemplar import episode_messages, render_exemplar
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
    memory_kind,
)
from agentevolver.schema.message import ChatMessage

__all__ = ["ExemplarSummarizer"]

logger = logging.getLogger(__name__)

#: Neighbours inspected for a stored exemplar of the same task (same text = same vector, so it ranks first
#: unless other memories share that exact text too).
_SAME_TASK_PROBE = 8


@dataclass(frozen=True, slots=True)
class _Candidate:
    task_id: str
    task: str
    messages: list[ChatMessage]
    score: float

    def better_than(self, score: float, n_messages: int) -> bool:
        """Higher score wins; at equal score, the shorter episode (the clearer worked example)."""
        return (self.score, -len(self.messages)) > (score, -n_messages)


def _exemplar_id(workspace_id: str, task: str) -> str:
    """A stable memory id per task text, so re-storing a task upserts its one exemplar."""
    return "exemplar-" + hashlib.sha256(f"{workspace_id}\0{task}".encode()).hexdigest()[:32]


class ExemplarSummarizer:
    """Stores solved episodes as exemplars; one per service, safe for concurrent requests."""

    def __init__(self, settings: SummarySettings, embedder: Embedder, store: VectorStore,
                 workspace_locks: defaultdict[str, asyncio.Lock]) -> None:
        self.settings = settings
        self.embedder = embedder
        self.store = store
        self._workspace_locks = workspace_locks

    async def summarize(self, request: SummaryRequest) -> SummaryResponse:
        threshold = self.settings.success_threshold
        stats = SummaryStats(trajectories=len(request.trajectories))
        best: dict[str, _Candidate] = {}
        tasks: set[str] = set()
        for trajectory in request.trajectories:
            candidate = self._candidate(trajectory)
            key = candidate.task_id or candidate.task
            tasks.add(key)
            if trajectory.score < threshold or not candidate.task:
                stats.failures += 1
                continue
            stats.successes += 1
            current = best.get(key)
            if current is None or candidate.better_than(current.score, len(current.messages)):
                best[key] = candidate
        stats.tasks = len(tasks)
        stats.extracted = len(best)
        rejected: list[RejectedMemory] = []
        stored = await self._store(request.workspace_id, list(best.values()), stats, rejected)
        stats.stored = len(stored)
        stats.rejected = len(rejected)
        answer = (f"stored {len(stored)} exemplar(s) from {stats.successes} solved of {stats.trajectories} "
                  f"trajectories ({stats.tasks} task(s)); {stats.failures} unsolved, not stored")
        logger.info("workspace %s: %s", request.workspace_id, answer)
        return SummaryResponse(answer=answer,
                               metadata=SummaryMetadata(memory_list=stored, rejected=rejected, stats=stats))

    @staticmethod
    def _candidate(trajectory: TrajectoryIn) -> _Candidate:
        messages = episode_messages(trajectory.messages)
        task = messages[0].content.strip() if messages and messages[0].role == "user" else ""
        return _Candidate(trajectory.task_id, task, messages, trajectory.score)

    def _memory(self, workspace_id: str, candidate: _Candidate, memory_id: str) -> TaskMemory:
        return TaskMemory(
            workspace_id=workspace_id, memory_id=memory_id, when_to_use=candidate.task,
            content=render_exemplar(candidate.messages, max_message_chars=self.settings.max_message_chars),
            score=candidate.score, author="exemplar",
            metadata={"kind": EXEMPLAR, "task_id": candidate.task_id, "source": "success",
                      "trajectory_scores": [candidate.score],
                      "messages": [m.model_dump(mode="json", exclude_none=True) for m in candidate.messages]})

    async def _store(self, workspace_id: str, candidates: list[_Candidate], stats: SummaryStats,
                     rejected: list[RejectedMemory]) -> list[TaskMemory]:
        if not candidates:
            return []
        vectors = await asyncio.to_thread(self.embedder.embed, [c.task for c in candidates])
        async with self._workspace_locks[workspace_id]:  # the same-task check and the write see one workspace
            keep: list[int] = []
            memories: list[TaskMemory] = []
            for i, candidate in enumerate(candidates):
                hits = await asyncio.to_thread(self.store.search, workspace_id, vectors[i], _SAME_TASK_PROBE)
                same = next((h.memory for h in hits if memory_kind(h.memory) == EXEMPLAR
                             and h.memory.when_to_use == candidate.task), None)
                memory_id = same.memory_id if same is not None else _exemplar_id(workspace_id, candidate.task)
                if same is not None:
                    if not candidate.better_than(same.score, len(same.metadata.get("messages") or [])):
                        stats.duplicates += 1
                        rejected.append(RejectedMemory(
                            when_to_use=candidate.task, content=render_exemplar(candidate.messages),
                            reason=f"task already has exemplar {same.memory_id} that is as good or better "
                                   "(higher score, or as high and no longer)"))
                        continue
                    stats.replaced += 1
                keep.append(i)
                memories.append(self._memory(workspace_id, candidate, memory_id))
            await asyncio.to_thread(self.store.upsert, workspace_id, memories, vectors[keep])
        return memories
