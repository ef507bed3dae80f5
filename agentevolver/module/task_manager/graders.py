"""Graders by name: what an episode of a task scores (``task_manager.grader``; seed 000, chapter 2, part 6).

* ``env``: the environment's own ``/evaluate`` score, which the agent flow already computed: returned as
  is. The grader of original tasks.
* ``llm``: the ``task_grader`` LLM judges the episode on relevance (did the agent work on this task),
  success and efficiency, with the task's reference answer when ``use_reference_answer`` is on and the
  task has one. ``scoring: binary`` gives 1 if relevant and successful, else 0; ``graded`` gives
  relevance x success x (0.5 + 0.5 x efficiency) from scores in [0, 1]. The grader of synthetic tasks,
  whose environment instance belongs to another (the seed) task, so ``/evaluate`` means nothing for them.

* ``reference``: the agent's final answer (after the profile's ``final_answer_marker`` in its last message)
  matched against the task's reference answer by code (:mod:`.answers`: numbers within the profile's
  tolerance). The grader of synthetic tasks whose answer the environment proved (:mod:`.proof`); no LLM.
  ``synthetic_grader: auto`` picks it when the profile declares that observations prove answers.

An episode already penalised for degenerate output (``reward.madness < 0``) keeps the agent flow's reward
and costs no judge call. A judge reply that never parses (after ``parse_retries``) or a judge that cannot
be reached scores 0 and is counted in the episode's metrics (``grader/unparsed``, ``grader/errors``):
one failed judgement never costs a training step.

For the agent loop: :class:`GraderPool` builds graders by name once per process, and
:func:`agrade_episode` re-scores an :class:`EpisodeResult` whose task row names a grader other than ``env``.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentevolver.client.llm_client import LLMClients
from agentevolver.client.structured_output import reply_schema
from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.errors import LLMError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.task_manager.answers import final_answer, match_answer
from agentevolver.module.task_manager.deps import ROLE_GRADER
from agentevolver.module.task_manager.parsing import aask_parsed, extract_json
from agentevolver.module.task_manager.profile import AnswerProof, ProfileError, load_profile
from agentevolver.module.task_manager.prompts import (
    GRADER_BINARY,
    GRADER_GRADED,
    GRADER_REFERENCE,
    GRADER_SYSTEM,
    GRADER_USER,
)
from agentevolver.module.task_manager.transcript import render_transcript
from agentevolver.registry import Registry
from agentevolver.schema import Reward, Task

__all__ = ["GRADERS", "EnvGrader", "Grader", "GraderPool", "LlmJudgeGrader", "ReferenceGrader", "agrade_episode",
           "episode_part"]

logger = logging.getLogger(__name__)

#: Graders by name (``task_manager.grader.original_grader`` / ``synthetic_grader``).
GRADERS: Registry[Callable[..., Grader]] = Registry("grader", "task_manager.grader.synthetic_grader")

#: Authors of the policy's own messages in an episode record (agent flow's context manager).
_POLICY_AUTHORS = ("llm", "llm(do_not_train)")


class Grader(ABC):
    """Scores one episode of one task; built once per process from the settings and the LLM clients."""

    def __init__(self, settings: AgentEvolverSettings, llm: LLMClients | None) -> None:
        self.settings = settings
        self.llm = llm

    @abstractmethod
    async def agrade(self, task: Task, messages: Sequence[Mapping[str, Any]], reward: Reward) -> tuple[Reward, dict[str, float]]:
        """``(reward, metrics)`` for an episode; ``reward`` is the one the agent flow computed (env score)."""


@GRADERS.register("env")
class EnvGrader(Grader):
    """The environment's score (see the module docstring)."""

    async def agrade(self, task: Task, messages: Sequence[Mapping[str, Any]], reward: Reward) -> tuple[Reward, dict[str, float]]:
        return reward, {}


class BinaryVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore")

    relevant: bool
    success: bool
    efficient: bool = True
    reason: str = Field(default="", json_schema_extra={"maxLength": 200})


class GradedVerdict(BaseModel):
    model_config = ConfigDict(extra="ignore")

    relevance: float = Field(ge=0.0, le=1.0)
    success: float = Field(ge=0.0, le=1.0)
    efficiency: float = Field(ge=0.0, le=1.0)
    reason: str = Field(default="", json_schema_extra={"maxLength": 200})


_SCHEMAS = {BinaryVerdict: reply_schema(BinaryVerdict, "binary_verdict"),
            GradedVerdict: reply_schema(GradedVerdict, "graded_verdict")}


@GRADERS.register("llm")
class LlmJudgeGrader(Grader):
    """The ``task_grader`` LLM as judge (see the module docstring)."""

    def __init__(self, settings: AgentEvolverSettings, llm: LLMClients | None) -> None:
        super().__init__(settings, llm)
        if llm is None:
            raise LLMError("the llm grader needs the task_grader LLM role (llm.roles.task_grader)")
        self.client = llm.for_role(ROLE_GRADER)
        self.section = settings.task_manager.grader
        self.retries = settings.task_manager.parse_retries
        self.max_chars = settings.task_manager.max_observation_chars

    def messages(self, task: Task, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
        binary = self.section.scoring == "binary"
        with_reference = self.section.use_reference_answer and bool(task.ground_truth)
        user = GRADER_USER.format(
            query=task.query or f"(the environment's task {task.task_id})",
            reference=GRADER_REFERENCE.format(answer=task.ground_truth) if with_reference else "",
            transcript=render_transcript(episode_part(messages), self.max_chars),
            success_hint=" (its result agrees with the reference answer)" if with_reference else "",
            reply_format=GRADER_BINARY if binary else GRADER_GRADED,
        )
        return [{"role": "system", "content": GRADER_SYSTEM}, {"role": "user", "content": user}]

    async def agrade(self, task: Task, messages: Sequence[Mapping[str, Any]], reward: Reward) -> tuple[Reward, dict[str, float]]:
        if reward.madness < 0:
            return reward, {"grader/skipped_mad": 1.0}
        binary = self.section.scoring == "binary"
        model = BinaryVerdict if binary else GradedVerdict
        try:
            reply = await aask_parsed(self.client, self.messages(task, messages),
                                      lambda text: model.model_validate(extract_json(text)), self.retries,
                                      schema=_SCHEMAS[model])
        except LLMError as err:
            logger.warning("llm grader: the judge failed, scoring 0: %s", err)
            return Reward(description=f"llm grader failed: {err}"), {"grader/errors": 1.0}
        metrics = {"grader/replies": float(reply.replies), "grader/unparsed_replies": float(reply.failures),
                   "grader/structured_replies": float(reply.structured)}
        verdict = reply.value
        if verdict is None:
            metrics["grader/unparsed"] = 1.0
            return Reward(description=f"llm grader: unparseable judge reply ({reply.errors[-1]}); scored 0"), metrics
        if isinstance(verdict, BinaryVerdict):
            success = 1.0 if verdict.relevant and verdict.success else 0.0
            score = success
            parts = f"relevant={verdict.relevant} success={verdict.success} efficient={verdict.efficient}"
        else:
            success = verdict.success
            score = verdict.relevance * verdict.success * (0.5 + 0.5 * verdict.efficiency)
            parts = f"relevance={verdict.relevance:g} success={verdict.success:g} efficiency={verdict.efficiency:g}"
        return Reward(outcome=score, success_rate=success, madness=reward.madness,
                      description=f"llm grader ({parts}): {verdict.reason}".strip()), metrics


@GRADERS.register("reference")
class ReferenceGrader(Grader):
    """The agent's final answer against the task's reference answer, by code (see the module docstring).

    Marker and tolerances come from the ``answers`` section of the task's environment profile
    (``task_manager.env_profile`` or the shipped one); without a profile or that section, the defaults of
    :class:`~agentevolver.module.task_manager.profile.AnswerProof`.
    """

    def __init__(self, settings: AgentEvolverSettings, llm: LLMClients | None) -> None:
        super().__init__(settings, llm)
        self._rules: dict[str, AnswerProof] = {}
        self._lock = threading.Lock()

    def rules(self, env_type: str) -> AnswerProof:
        with self._lock:
            if env_type not in self._rules:
                try:
                    answers = load_profile(env_type, self.settings.task_manager.env_profile).answers
                except ProfileError:
                    answers = None
                self._rules[env_type] = answers or AnswerProof(proved_by="observations")
            return self._rules[env_type]

    async def agrade(self, task: Task, messages: Sequence[Mapping[str, Any]], reward: Reward) -> tuple[Reward, dict[str, float]]:
        if reward.madness < 0:
            return reward, {"grader/skipped_mad": 1.0}
        if not task.ground_truth:
            return Reward(madness=reward.madness, description="reference grader: the task has no reference "
                                                              "answer; scored 0"), {"grader/no_reference": 1.0}
        rules = self.rules(task.env_type)
        last = next((m for m in reversed(episode_part(messages)) if _is_agent(m)), None)
        given = final_answer(str(last.get("content") or ""), rules.final_answer_marker) if last else None
        match = match_answer(given, task.ground_truth, rel_tol=rules.rel_tol, abs_tol=rules.abs_tol)
        score = 1.0 if match.correct else 0.0
        return (Reward(outcome=score, success_rate=score, madness=reward.madness,
                       description=f"reference grader: {match.description}"),
                {"grader/reference_correct": score})


def _is_agent(message: Mapping[str, Any]) -> bool:
    author = message.get("author")
    return author in _POLICY_AUTHORS or (author is None and message.get("role") == "assistant")


def episode_part(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """What the agent did: the messages from its first action on (the task is shown to the judge apart,
    and the environment's system prompt and worked demonstrations are not the agent's doing)."""
    for index, message in enumerate(messages):
        author = message.get("author")
        if author in _POLICY_AUTHORS or (author is None and message.get("role") == "assistant"):
            return list(messages[index:])
    return [m for m in messages if m.get("role") != "system"]


class GraderPool:
    """Graders by name, built on first use and shared (thread-safe); one per agent-loop worker process."""

    def __init__(self, settings: AgentEvolverSettings, llm: LLMClients | None) -> None:
        self.settings = settings
        self.llm = llm
        self._graders: dict[str, Grader] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: AgentEvolverSettings) -> GraderPool:
        """A pool for the run's validated settings (the agent-loop worker's), with its own LLM clients."""
        return cls(settings, LLMClients(settings.llm))

    def get(self, name: str) -> Grader:
        with self._lock:
            grader = self._graders.get(name)
            if grader is None:
                grader = self._graders[name] = GRADERS.create(name, self.settings, self.llm)
            return grader


async def agrade_episode(result: EpisodeResult, spec: EpisodeSpec, pool: GraderPool) -> EpisodeResult:
    """``result`` re-scored by the grader its task names (``spec.task.evaluator``; ``env`` = unchanged).

    The new reward replaces the episode's and every sample's reward; the grader's counters are added to
    the episode's metrics.
    """
    task = spec.task
    if task is None or task.evaluator == "env" or not result.messages:  # no episode to judge (e.g. /create failed): keep its 0
        return result
    reward, metrics = await pool.get(task.evaluator).agrade(task, result.messages, result.reward)
    samples = [s.model_copy(update={"reward": reward}) for s in result.samples]
    return result.model_copy(update={"reward": reward, "samples": samples, "metrics": {**result.metrics, **metrics}})
