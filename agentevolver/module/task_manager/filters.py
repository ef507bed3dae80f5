"""Task filters, pluggable by name: real-time filters run on each batch as it is generated, post filters
once on everything generated (seed 000, chapter 2: two layers of filters).

* ``dedup`` (real-time): drops a task that is an exact duplicate (after :func:`normalize_text`) or a near
  duplicate (embedding cosine >= ``task_manager.dedup.threshold``) of a task already generated from the
  same seed task, or of an earlier task in the same batch. Tasks whose numbers differ are never near
  duplicates: "12 * 31" and "12 * 32" are different tasks however similar the text.
* ``llm_feasibility`` (post): the ``task_filter`` LLM judges, from the environment profile, whether the
  task can be done in the environment; an unparseable verdict (after retries) drops the task and is counted.
  A task whose answer the environment proved (:mod:`.proof`) is kept without asking: the environment did
  it, from inputs the task states, which is better evidence than a judge's opinion.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from agentevolver.client.structured_output import reply_schema
from agentevolver.embedders import Embedder, EmbeddingSettings, build_embedder, normalize_text
from agentevolver.module.task_manager.deps import ROLE_FILTER, TaskManagerDeps
from agentevolver.module.task_manager.parsing import FeasibilityReply, ask_parsed, extract_json
from agentevolver.module.task_manager.prompts import (
    DEMO_FILTER,
    DEMO_PROFILE,
    FILTER_SYSTEM,
    FILTER_USER,
)
from agentevolver.registry import Registry
from agentevolver.schema import TaskObjective

__all__ = ["POST_FILTERS", "REALTIME_FILTERS", "DedupFilter", "Dropped", "FilterResult", "LlmFeasibilityFilter",
           "PostFilter", "RealtimeFilter", "Verdict"]

#: Real-time filters by name (``task_manager.realtime_filters``).
REALTIME_FILTERS: Registry[Callable[..., RealtimeFilter]] = Registry(
    "real-time filter", "task_manager.realtime_filters"
)
#: Post filters by name (``task_manager.post_filters``).
POST_FILTERS: Registry[Callable[..., PostFilter]] = Registry("post filter", "task_manager.post_filters")

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
#: The dedup embedder runs inside the trainer's process: torch's thread count is the trainer's to set.
_IN_PROCESS = EmbeddingSettings(threads=None)


@dataclass(frozen=True)
class Dropped:
    """A task a filter removed, and why (``reason`` is a short code counted in the run's statistics)."""

    objective: TaskObjective
    reason: str


@dataclass
class FilterResult:
    kept: list[TaskObjective]
    dropped: list[Dropped] = field(default_factory=list)


class RealtimeFilter(ABC):
    """Filters the tasks one exploration wrote against those already kept for the same seed task."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps

    @abstractmethod
    def filter(self, candidates: Sequence[TaskObjective], existing: Sequence[TaskObjective]) -> FilterResult:
        """Return the candidates to keep; ``existing`` are the tasks kept so far for this seed task."""


@REALTIME_FILTERS.register("dedup")
class DedupFilter(RealtimeFilter):
    """Exact and near-duplicate removal (see the module docstring)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        super().__init__(deps)
        self.threshold = deps.section.dedup.threshold
        self.embedder: Embedder = build_embedder(deps.section.dedup.embedder, _IN_PROCESS,
                                                 field="task_manager.dedup.embedder")

    def filter(self, candidates: Sequence[TaskObjective], existing: Sequence[TaskObjective]) -> FilterResult:
        result = FilterResult(kept=[])
        if not candidates:
            return result
        seen_texts = [o.task.query or "" for o in existing]
        seen_norm = {normalize_text(t) for t in seen_texts}
        seen_vectors = list(self.embedder.embed(seen_texts)) if seen_texts else []
        vectors = self.embedder.embed([o.task.query or "" for o in candidates])
        for objective, vector in zip(candidates, vectors, strict=True):
            text = objective.task.query or ""
            if normalize_text(text) in seen_norm:
                result.dropped.append(Dropped(objective, "exact_duplicate"))
                continue
            numbers = _numbers(text)
            similar = [i for i, v in enumerate(seen_vectors) if float(np.dot(v, vector)) >= self.threshold]
            if any(_numbers(seen_texts[i]) == numbers for i in similar):
                result.dropped.append(Dropped(objective, "near_duplicate"))
                continue
            result.kept.append(objective)
            seen_texts.append(text)
            seen_norm.add(normalize_text(text))
            seen_vectors.append(vector)
        return result


def _numbers(text: str) -> list[str]:
    return sorted(_NUMBER.findall(text))


@dataclass(frozen=True)
class Verdict:
    """A post filter's decision on one task (``unparsed``: the judge's reply never parsed; dropped)."""

    keep: bool
    reason: str = ""
    unparsed: bool = False
    replies: int = 0
    without_llm: bool = False  # decided without asking (e.g. an answer proved by the environment)


class PostFilter(ABC):
    """Judges one task at a time (called from worker threads; must not keep per-call state)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps

    @property
    def fingerprint(self) -> str:
        """What a cached verdict depends on besides the task (e.g. the judge model); cached verdicts of
        another fingerprint are discarded on resume."""
        return type(self).__qualname__

    @abstractmethod
    def judge(self, objective: TaskObjective) -> Verdict:
        """Keep or drop ``objective``; raises only LLMError / EnvClientError when a service fails."""


@POST_FILTERS.register("llm_feasibility")
class LlmFeasibilityFilter(PostFilter):
    """The ``task_filter`` LLM judges feasibility (see the module docstring)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        super().__init__(deps)
        self.client = deps.client(ROLE_FILTER)

    @property
    def fingerprint(self) -> str:
        return f"llm_feasibility:{self.client.endpoint.base_url}:{self.client.model}"

    def messages(self, objective: TaskObjective) -> list[dict[str, str]]:
        """The request for one task, after the worked examples when ``task_manager.demonstrations`` is on."""
        task = objective.task
        user = FILTER_USER.format(profile=self.deps.profile.render(), query=task.query,
                                  answer=task.ground_truth or "(none given)")
        messages = [{"role": "system", "content": FILTER_SYSTEM}]
        if self.deps.section.demonstrations:
            for query, answer, verdict in DEMO_FILTER:
                demo = FILTER_USER.format(profile=DEMO_PROFILE, query=query, answer=answer)
                messages += [{"role": "user", "content": demo}, {"role": "assistant", "content": verdict}]
        return [*messages, {"role": "user", "content": user}]

    def judge(self, objective: TaskObjective) -> Verdict:
        if objective.task.metadata.get("proof"):
            return Verdict(keep=True, reason="answer proved by the environment's observations", without_llm=True)
        reply = ask_parsed(self.client, self.messages(objective), _parse_feasibility, self.deps.section.parse_retries,
                           schema=_VERDICT_SCHEMA)
        if reply.value is None:
            return Verdict(keep=False, reason=f"unparseable verdict: {reply.errors[-1]}", unparsed=True,
                           replies=reply.replies)
        return Verdict(keep=reply.value.feasible, reason=reply.value.reason, replies=reply.replies)


_VERDICT_SCHEMA = reply_schema(FeasibilityReply, "feasibility")


def _parse_feasibility(text: str) -> FeasibilityReply:
    """A JSON verdict; a bare leading yes/no is accepted too (small judges often answer that way)."""
    first = text.strip().lower()
    if first.startswith(("yes", "no")) and "{" not in first:
        return FeasibilityReply(feasible=first.startswith("yes"), reason=text.strip()[:200])
    return FeasibilityReply.model_validate(extract_json(text))
