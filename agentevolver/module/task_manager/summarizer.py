"""Summarisation: an exploration trajectory -> task objectives, via the ``task_summarizer`` LLM role.

The trajectory is masked first (:mod:`.masking`): the summariser never sees the seed task's query. The
environment's worked demonstrations (opening turns between its system message and the task message) are
left out of the record: they are examples the environment gives every episode, not something the
exploration did. With ``task_manager.demonstrations`` a worked example (a made-up notes app) comes
first, as an earlier exchange; a task copying its text (a query or an answer) is rejected. The reply is parsed and schema-validated (:mod:`.parsing`); an unparseable reply is
retried with its error shown, at most ``task_manager.parse_retries`` times, and then counted, never raised.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from agentevolver.module.task_manager.deps import ROLE_SUMMARIZER, TaskManagerDeps
from agentevolver.module.task_manager.masking import mask_query
from agentevolver.module.task_manager.parsing import ask_parsed, parse_summary
from agentevolver.module.task_manager.prompts import (
    DEMO_PROFILE,
    DEMO_TASKS,
    DEMO_TEXTS,
    DEMO_TRANSCRIPT,
    MASK,
    SUMMARIZER_SYSTEM,
    SUMMARIZER_USER,
)
from agentevolver.module.task_manager.transcript import render_transcript
from agentevolver.schema import ChatMessage, Task, TaskObjective, Trajectory

__all__ = ["Summarizer", "SummaryOutcome", "record_for_summary", "synthetic_task_id"]


@dataclass
class SummaryOutcome:
    """Objectives written from one trajectory, and how the summariser's replies went."""

    objectives: list[TaskObjective]
    replies: int = 0
    unparsed_replies: int = 0
    rejected_items: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def parsed(self) -> bool:
        return self.replies > self.unparsed_replies


def synthetic_task_id(seed_task_id: str, query: str) -> str:
    """A stable id for a synthetic task: its seed and a digest of its query."""
    return f"{seed_task_id}~syn-{hashlib.sha256(query.encode()).hexdigest()[:10]}"


def record_for_summary(trajectory: Trajectory) -> list[ChatMessage]:
    """The masked messages the summariser may see: the opening's system messages, the masked task message,
    and everything the exploration did."""
    query_index = trajectory.metadata.get("query_index")
    opening_len = int(trajectory.metadata.get("opening_len", 0))
    masked = mask_query(trajectory.messages, trajectory.query, query_index)
    keep = [i for i, m in enumerate(masked[:opening_len]) if m.role == "system" or i == query_index]
    return [masked[i] for i in keep] + masked[opening_len:]


class Summarizer:
    """Writes task objectives from trajectories (thread-safe; one per generation run)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps
        self.client = deps.client(ROLE_SUMMARIZER)
        self.section = deps.section

    def messages(self, trajectory: Trajectory) -> list[dict[str, str]]:
        """The request the summariser gets for ``trajectory`` (masked; see the module docstring), after the
        worked example when ``task_manager.demonstrations`` is on."""
        transcript = render_transcript(record_for_summary(trajectory), self.section.max_observation_chars)
        k = self.section.tasks_per_exploration
        user = SUMMARIZER_USER.format(profile=self.deps.profile.render(), mask=MASK, transcript=transcript, k=k)
        messages = [{"role": "system", "content": SUMMARIZER_SYSTEM}]
        if self.section.demonstrations:
            demo = SUMMARIZER_USER.format(profile=DEMO_PROFILE, mask=MASK, transcript=DEMO_TRANSCRIPT, k=k)
            messages += [{"role": "user", "content": demo},
                         {"role": "assistant", "content": json.dumps(DEMO_TASKS[:k], ensure_ascii=False)}]
        return [*messages, {"role": "user", "content": user}]

    def summarize(self, seed: Task, trajectory: Trajectory) -> SummaryOutcome:
        """Ask, parse (with retries) and build objectives; raises only LLMError (the server failed)."""
        limit = self.section.tasks_per_exploration
        rejected: list[int] = [0]

        forbidden = DEMO_TEXTS if self.section.demonstrations else ()

        def parse(text: str) -> list:
            parsed = parse_summary(text, limit, forbidden=forbidden)
            rejected[0] += len(parsed.rejected)
            return parsed.items

        reply = ask_parsed(self.client, self.messages(trajectory), parse, self.section.parse_retries)
        outcome = SummaryOutcome(objectives=[], replies=reply.replies, unparsed_replies=reply.failures,
                                 rejected_items=rejected[0], errors=reply.errors)
        for item in reply.value or []:
            task = Task(
                task_id=synthetic_task_id(seed.task_id, item.query), env_type=seed.env_type, query=item.query,
                ground_truth=item.answer, open_query=item.answer is None,
                evaluator=self.section.grader.synthetic_grader,
                metadata={"exploration": f"{seed.task_id}#{trajectory.rollout_id}"},
            )
            outcome.objectives.append(TaskObjective(task=task, source="synthetic", seed_task_id=seed.task_id,
                                                    confidence=item.confidence))
        return outcome
