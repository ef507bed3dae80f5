"""Distil a step's episodes into experiences, in the background (seed 002, section 4).

The trainer hands over finished episodes; they become ``/summary_task_memory`` requests of at most
``exp_manager.summary_batch_size`` trajectories, a task's episodes kept together where they fit (the
service compares a task's successes with its failures only within one request). Requests run on a small
thread pool, so a summary that waits minutes on its LLM never delays training; the trainer collects what
finished at its next step (:meth:`BackgroundSummarizer.drain`) as counted metrics. A failed request (the
service is down, its LLM failed) is logged and counted, never raised.

With ``exp_manager.experience_kind: exemplar`` the requests ask the service to store each task's best solved
episode whole (no LLM call there), and each episode is sent from its task message on with its tool calls,
tool results and their ids, since that is the worked example.

Only the initial summarisation (``init_exp_before_training``) waits (:meth:`BackgroundSummarizer.wait`):
the first step's retrieval needs its result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from itertools import groupby
from typing import Any

from agentevolver.client.http import ServiceClientError
from agentevolver.client.memory_client import MemoryClient
from agentevolver.schema.memory_wire import ADVICE, EXEMPLAR, ExperienceKind

__all__ = ["BackgroundSummarizer", "summary_requests", "trajectories_from_records"]

logger = logging.getLogger(__name__)

#: Message authors that are not the episode itself: injected experience and context-manager notes.
_NOT_EPISODE = {"experience", "memory"}
#: Episodes that never reached the model or the environment have nothing to learn from.
_UNUSABLE = {"env_error", "error"}


#: Message fields an exemplar keeps besides role and content: a worked example needs its calls and results.
_TOOL_FIELDS = ("tool_calls", "tool_call_id", "name")


def _exemplar_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The episode from its task message on: the last opening user message (``step`` -1: the environment's
    opening messages, which may hold demonstrations before it) and every turn after it (``step`` >= 0)."""
    opening = [m for m in messages if m.get("step", -1) < 0]
    task = next((m for m in reversed(opening) if m["role"] == "user"), None)
    turns = [m for m in messages if m.get("step", -1) >= 0]
    return [{"role": m["role"], "content": str(m.get("content") or ""),
             **{key: m[key] for key in _TOOL_FIELDS if m.get(key) is not None}}
            for m in ([task] if task is not None else []) + turns]


def trajectories_from_records(records: Iterable[Mapping[str, Any]], scores: Sequence[float], *,
                              kind: ExperienceKind = ADVICE) -> list[dict[str, Any]]:
    """``/summary_task_memory`` trajectories of episodes (dump records with messages) and their scores.

    Injected experience is left out (summarising it would feed the memory its own text back); episodes that
    failed before any turn are skipped. ``advice`` sends every message as ``{role, content}`` (ReMe's
    shape); ``exemplar`` sends the episode from its task message on, with tool calls and tool results (see
    :func:`_exemplar_messages`), unsolved ones included: the service's ``success_threshold`` decides.
    """
    out = []
    for record, score in zip(records, scores, strict=True):
        if not isinstance(record, Mapping) or record.get("termination") in _UNUSABLE or not record.get("num_turns"):
            continue
        episode = [m for m in record.get("messages") or [] if m.get("author") not in _NOT_EPISODE]
        if kind == EXEMPLAR:
            messages = _exemplar_messages(episode)
        else:
            messages = [{"role": m["role"], "content": str(m.get("content") or "")} for m in episode]
        if messages:
            out.append({"task_id": str(record.get("task_id", "")), "score": float(score), "messages": messages})
    return out


def summary_requests(trajectories: Sequence[dict[str, Any]], batch_size: int) -> list[list[dict[str, Any]]]:
    """Requests of at most ``batch_size`` trajectories; a task's trajectories share a request when they fit."""
    requests: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    ordered = sorted(trajectories, key=lambda t: t["task_id"])
    for _, group in groupby(ordered, key=lambda t: t["task_id"]):
        episodes = list(group)
        if current and len(current) + len(episodes) > batch_size:
            requests.append(current)
            current = []
        while len(episodes) > batch_size:
            requests.append(episodes[:batch_size])
            episodes = episodes[batch_size:]
        current += episodes
    if current:
        requests.append(current)
    return requests


class BackgroundSummarizer:
    """Submits summary requests to the memory service on a thread pool and counts how they went."""

    def __init__(self, client: MemoryClient, workspace_id: str, batch_size: int, max_workers: int = 2, *,
                 kind: ExperienceKind = ADVICE) -> None:
        self.client = client
        self.workspace_id = workspace_id
        self.batch_size = batch_size
        self.kind: ExperienceKind = kind
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="exp-summary")
        self._pending: list[Future[int]] = []
        self._lock = threading.Lock()
        #: Totals since start: requests submitted, finished, failed; trajectories sent; experiences stored.
        self.totals = {"submitted": 0, "finished": 0, "failed": 0, "trajectories": 0, "stored": 0}

    def submit(self, trajectories: Sequence[dict[str, Any]]) -> int:
        """Queue the trajectories as requests; returns how many requests were queued."""
        requests = summary_requests(trajectories, self.batch_size)
        with self._lock:
            for request in requests:
                self._pending.append(self._pool.submit(self._summarise, request))
            self.totals["submitted"] += len(requests)
            self.totals["trajectories"] += sum(len(r) for r in requests)
        return len(requests)

    def _summarise(self, trajectories: list[dict[str, Any]]) -> int:
        # advice sends no experience_kind: ReMe's own request, so a real ReMe server answers it
        response = self.client.summary(self.workspace_id, trajectories,
                                       experience_kind=EXEMPLAR if self.kind == EXEMPLAR else None)
        return len(response.metadata.memory_list)

    def drain(self) -> dict[str, float]:
        """Collect finished requests; metrics of what finished since the last call plus running totals."""
        with self._lock:  # one look per future: one that finishes meanwhile is collected next time
            done, pending = [], []
            for future in self._pending:
                (done if future.done() else pending).append(future)
            self._pending = pending
        finished = failed = stored = 0
        for future in done:
            try:
                stored += future.result()
                finished += 1
            except (ServiceClientError, OSError) as err:
                failed += 1
                logger.warning("experience summary failed (the memory keeps what it had): %s", err)
            except Exception:  # a bug in a request must not end training either; it is logged in full
                failed += 1
                logger.exception("experience summary failed unexpectedly")
        with self._lock:
            self.totals["finished"] += finished
            self.totals["failed"] += failed
            self.totals["stored"] += stored
            in_flight = len(self._pending)
        return {"exp/summary_finished": float(finished), "exp/summary_failed": float(failed),
                "exp/summary_stored": float(stored), "exp/summary_in_flight": float(in_flight),
                "exp/summary_failed_total": float(self.totals["failed"]),
                "exp/summary_stored_total": float(self.totals["stored"])}

    def wait(self, timeout: float | None = None) -> dict[str, float]:
        """Block until every queued request has finished (or ``timeout`` seconds passed); then :meth:`drain`."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout=timeout)
        return self.drain()

    def close(self, wait_for_pending: bool = False) -> None:
        """Stop the pool; pending requests are abandoned unless ``wait_for_pending``."""
        self._pool.shutdown(wait=wait_for_pending, cancel_futures=not wait_for_pending)
