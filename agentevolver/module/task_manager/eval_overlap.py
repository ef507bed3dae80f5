"""No synthetic task may be an evaluation task: the ``eval_overlap`` real-time filter and the report's count.

Why: a task writer that renders what the explorer computed can write, word for word, a question of the
validation or test split ("What is 59 * 63?" is both a natural exploration and one of calc's test tasks).
Training on it would score the policy on a task it was trained on. Seeds never come from the validation split
(:mod:`.seeds`), but that does not stop a written task from *equalling* one, so the written query is compared,
as :func:`~agentevolver.embedders.normalize_text` writes it (case, spacing and surrounding punctuation aside),
against the query of every task of ``task_manager.eval_splits``. The queries are read through the environment
service like any episode's opening (``/get_env_profile``, then ``/create`` + ``/release`` per task), once per
run, in ``num_explore_threads`` threads; a split the environment does not have is skipped and logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from agentevolver.client.env_client import EnvClientError
from agentevolver.embedders import normalize_text
from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.exploration import query_position
from agentevolver.module.task_manager.filters import REALTIME_FILTERS, Dropped, FilterResult, RealtimeFilter
from agentevolver.schema import TaskObjective

__all__ = ["EvalOverlapFilter", "EvalQueries", "overlap"]

logger = logging.getLogger(__name__)


class EvalQueries:
    """The normalised queries of ``task_manager.eval_splits``, listed on first use (thread-safe, once)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps
        self._lock = threading.Lock()
        self._texts: frozenset[str] | None = None
        #: the splits compared (those the environment has), known once listed
        self.splits: list[str] = []

    def texts(self) -> frozenset[str]:
        with self._lock:
            if self._texts is None:
                self._texts = frozenset(self._list())
            return self._texts

    def _list(self) -> list[str]:
        env, env_type = self.deps.env_client(), self.deps.env_type
        task_ids: list[str] = []
        for split in self.deps.section.eval_splits:
            try:
                task_ids += env.get_env_profile(env_type, split)
            except EnvClientError as err:
                if err.code != "unknown_split":
                    raise
                logger.info("task_manager.eval_splits: environment %r has no split %r; not compared", env_type, split)
                continue
            self.splits.append(split)
        if self.deps.section.eval_splits and not self.splits:
            raise ConfigError(f"task_manager.eval_splits: environment {env_type!r} has none of the splits "
                              f"{self.deps.section.eval_splits}; name its validation/test splits (or [] to compare none)")
        with ThreadPoolExecutor(max_workers=self.deps.section.num_explore_threads,
                                thread_name_prefix="eval-queries") as pool:
            queries = list(pool.map(self._query, task_ids))
        return [normalize_text(q) for q in queries if q]

    def _query(self, task_id: str) -> str | None:
        """The question task ``task_id`` opens with (the last user message of its opening)."""
        env = self.deps.env_client()
        created = env.create(self.deps.env_type, task_id, params=self.deps.create_params)
        try:
            index = query_position(list(created.state))
            return created.state[index].content if index is not None else None
        finally:
            env.release(created.info.instance_id)


def overlap(objectives: Sequence[TaskObjective], queries: EvalQueries) -> int:
    """How many of ``objectives`` equal an evaluation task (normalised query text)."""
    if not objectives:
        return 0
    texts = queries.texts()
    return sum(1 for o in objectives if normalize_text(o.task.query or "") in texts)


@REALTIME_FILTERS.register("eval_overlap")
class EvalOverlapFilter(RealtimeFilter):
    """Drops a task whose query equals one of ``task_manager.eval_splits``' (reason ``eval_overlap``)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        super().__init__(deps)
        self.queries = deps.eval_queries

    def filter(self, candidates: Sequence[TaskObjective], existing: Sequence[TaskObjective]) -> FilterResult:
        texts = self.queries.texts() if candidates else frozenset()
        result = FilterResult(kept=[])
        for objective in candidates:
            if normalize_text(objective.task.query or "") in texts:
                result.dropped.append(Dropped(objective, "eval_overlap"))
            else:
                result.kept.append(objective)
        return result
