"""Summarisation: an exploration trajectory -> task objectives, via the ``task_summarizer`` LLM role.

The trajectory is masked first (:mod:`.masking`): the summariser never sees the seed task's query. The
environment's worked demonstrations (opening turns between its system message and the task message) are
left out of the record: they are examples the environment gives every episode, not something the
exploration did. With ``task_manager.demonstrations`` a worked example (a made-up app) comes first, as an
earlier exchange; a task copying its text (a query or an answer) is rejected. The reply's schema is sent as
``response_format`` where the endpoint takes it; the reply is parsed and schema-validated (:mod:`.parsing`);
an unparseable reply is retried with its error shown, at most ``task_manager.parse_retries`` times, and
then counted, never raised.

When the environment's profile declares that observations prove answers (``answers``), the summariser asks
for ``{query, answer, evidence}`` and keeps only the tasks whose answer :func:`.proof.prove` finds in what
the environment returned; the others are counted by reason (``SummaryOutcome.proofs``).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.module.task_manager.deps import ROLE_SUMMARIZER, TaskManagerDeps
from agentevolver.module.task_manager.masking import mask_query
from agentevolver.module.task_manager.parsing import ask_parsed, parse_summary, summary_schema
from agentevolver.module.task_manager.prompts import (
    DEMO_GROUNDED_PROFILE,
    DEMO_GROUNDED_RESULTS,
    DEMO_GROUNDED_TASKS,
    DEMO_GROUNDED_TEXTS,
    DEMO_GROUNDED_TRANSCRIPT,
    DEMO_PROFILE,
    DEMO_TASKS,
    DEMO_TEXTS,
    DEMO_TRANSCRIPT,
    MASK,
    SUMMARIZER_SYSTEM,
    SUMMARIZER_USER,
    SUMMARIZER_USER_GROUNDED,
)
from agentevolver.module.task_manager.proof import observations, prove
from agentevolver.module.task_manager.transcript import render_transcript
from agentevolver.schema import ChatMessage, Task, TaskObjective, Trajectory

__all__ = ["Summarizer", "SummaryOutcome", "add_objectives", "llm_writer_identity", "record_for_summary", "synthetic_task_id"]


@dataclass
class SummaryOutcome:
    """Objectives written from one trajectory, and how the summariser's replies went."""

    objectives: list[TaskObjective]
    replies: int = 0
    unparsed_replies: int = 0
    rejected_items: int = 0
    errors: list[str] = field(default_factory=list)
    structured_replies: int = 0
    format_fallbacks: int = 0
    #: grounded profiles only: ``checked``, ``proved`` and ``rejected_<reason>`` (see :mod:`.proof`)
    proofs: Counter[str] = field(default_factory=Counter)
    #: the environment writer only (``task_manager.writer: env``): what its rendering did (:mod:`.env_writer`);
    #: None when an LLM wrote the tasks
    rendered: Counter[str] | None = None

    @property
    def parsed(self) -> bool:
        """Whether the writer produced a usable answer (an LLM reply that parsed; the environment always does)."""
        return self.rendered is not None or self.replies > self.unparsed_replies


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


def tool_results(trajectory: Trajectory) -> str:
    """The record's tool results and their calls as a list (grounded prompt): what an answer must be one of."""
    lines = [f"- {obs.text.strip()} (from {obs.call})" for obs in observations(trajectory) if obs.call is not None]
    return "\n".join(lines) or "(none: no tool returned anything)"


class Summarizer:
    """Writes task objectives from trajectories (thread-safe; one per generation run)."""

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps
        self.client = deps.client(ROLE_SUMMARIZER)
        self.section = deps.section

    @property
    def grounded(self) -> bool:
        """Whether answers must be proved by the environment's observations (the profile's ``answers``)."""
        return self.deps.profile.answers is not None

    def messages(self, trajectory: Trajectory) -> list[dict[str, str]]:
        """The request the summariser gets for ``trajectory`` (masked; see the module docstring), after the
        worked example when ``task_manager.demonstrations`` is on."""
        transcript = render_transcript(record_for_summary(trajectory), self.section.max_observation_chars)
        k = self.section.tasks_per_exploration
        template = SUMMARIZER_USER_GROUNDED if self.grounded else SUMMARIZER_USER
        user = template.format(profile=self.deps.profile.render(), mask=MASK, transcript=transcript, k=k,
                               results=tool_results(trajectory))
        messages = [{"role": "system", "content": SUMMARIZER_SYSTEM}]
        if self.section.demonstrations:
            if self.grounded:
                demo = template.format(profile=DEMO_GROUNDED_PROFILE, mask=MASK, transcript=DEMO_GROUNDED_TRANSCRIPT,
                                       k=k, results=DEMO_GROUNDED_RESULTS)
                reply: Any = DEMO_GROUNDED_TASKS
            else:
                demo = template.format(profile=DEMO_PROFILE, mask=MASK, transcript=DEMO_TRANSCRIPT, k=k)
                reply = {"tasks": DEMO_TASKS[:k]}
            messages += [{"role": "user", "content": demo},
                         {"role": "assistant", "content": json.dumps(reply, ensure_ascii=False)}]
        return [*messages, {"role": "user", "content": user}]

    def summarize(self, seed: Task, trajectory: Trajectory) -> SummaryOutcome:
        """Ask, parse (with retries), check proofs (grounded profiles) and build objectives; raises only
        LLMError (the server failed)."""
        limit = self.section.tasks_per_exploration
        grounded = self.grounded
        rejected: list[int] = [0]
        forbidden: tuple[str, ...] = ()
        if self.section.demonstrations:
            forbidden = DEMO_GROUNDED_TEXTS if grounded else DEMO_TEXTS

        def parse(text: str) -> list:
            parsed = parse_summary(text, limit, forbidden=forbidden, grounded=grounded)
            rejected[0] += len(parsed.rejected)
            return parsed.items

        reply = ask_parsed(self.client, self.messages(trajectory), parse, self.section.parse_retries,
                           schema=summary_schema(limit, grounded))
        outcome = SummaryOutcome(objectives=[], replies=reply.replies, unparsed_replies=reply.failures,
                                 rejected_items=rejected[0], errors=reply.errors, structured_replies=reply.structured,
                                 format_fallbacks=reply.format_fallbacks)
        add_objectives(self.deps, seed, trajectory, reply.value or [], outcome)
        return outcome

    def identity(self) -> str:
        """Who writes the tasks, for the run's report: the role's model and endpoint."""
        return llm_writer_identity(self.deps.settings)


def llm_writer_identity(settings: AgentEvolverSettings) -> str:
    """``llm: <model> (llm.roles.task_summarizer -> endpoint <name>)``: which model wrote a run's tasks."""
    name, endpoint = settings.llm.endpoint_for(ROLE_SUMMARIZER)
    return f"llm: {endpoint.model} (llm.roles.{ROLE_SUMMARIZER} -> endpoint {name})"


def add_objectives(deps: TaskManagerDeps, seed: Task, trajectory: Trajectory, items: Sequence[Any],
                   outcome: SummaryOutcome) -> None:
    """Proposed tasks (``query``, ``answer``, ``evidence``, optional ``confidence``) -> objectives in ``outcome``.

    One place for both writers (the LLM and the environment, :mod:`.env_writer`), so their tasks pass the same
    proof check (grounded profiles: unproved answers are dropped and counted by reason) and carry the same
    metadata, id and grader.
    """
    grounded = deps.profile.answers is not None
    record = observations(trajectory) if grounded else []
    for item in items:
        metadata: dict[str, Any] = {"exploration": f"{seed.task_id}#{trajectory.rollout_id}"}
        if getattr(item, "level", None):  # the environment writer's level (calc: single ... convert)
            metadata["level"] = item.level
        if grounded:
            assert deps.profile.answers is not None
            proof = prove(item.query, item.answer, record, deps.profile.answers)
            outcome.proofs["checked"] += 1
            if not proof.proved:
                outcome.proofs[f"rejected_{proof.reason}"] += 1
                outcome.errors.append(f"unproved answer {item.answer!r} ({proof.reason}): {proof.detail}")
                continue
            outcome.proofs["proved"] += 1
            metadata.update(evidence=item.evidence, proof=proof.metadata())
        task = Task(
            task_id=synthetic_task_id(seed.task_id, item.query), env_type=seed.env_type, query=item.query,
            ground_truth=item.answer, open_query=item.answer is None, evaluator=deps.synthetic_grader,
            metadata=metadata,
        )
        outcome.objectives.append(TaskObjective(task=task, source="synthetic", seed_task_id=seed.task_id,
                                                confidence=getattr(item, "confidence", None)))
