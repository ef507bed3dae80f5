"""What one episode produced: its samples, how it ended, its reward and numbers, and its dump record.

An :class:`EpisodeResult` is returned for every episode, failed ones included (``termination`` says why
it ended, ``error`` what went wrong), so the trainer counts failures instead of losing them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentevolver.schema.sample import Sample
from agentevolver.schema.task import Task, TaskObjective
from agentevolver.schema.trajectory import Reward

__all__ = ["TERMINATIONS", "EpisodeResult", "EpisodeSpec", "Termination"]

#: Why an episode ended:
#: ``finished`` - the environment said the task is over; ``max_steps`` - ``agent_flow.max_steps`` generations;
#: ``budget`` - no generation fits the token budget any more; ``env_error`` - the environment failed
#: (instance lost, or ``max_env_errors`` failed steps in a row, or /create failed); ``parse_error`` -
#: malformed actions (``on_parse_error``/``max_parse_errors``); ``madness`` - a repetitive generation
#: with ``madness.terminate``; ``error`` - anything else (e.g. the rollout server failed), see ``error``.
Termination = Literal["finished", "max_steps", "budget", "env_error", "parse_error", "madness", "error"]
TERMINATIONS: tuple[str, ...] = ("finished", "max_steps", "budget", "env_error", "parse_error", "madness", "error")


class EpisodeSpec(BaseModel):
    """One episode to run: the task and what this rollout of it carries.

    ``group_id`` groups the ``rollout.n`` episodes of a task (GRPO's group). Self-Navigating: ``experience``
    is text appended to the task message as given; ``add_experience`` asks the flow's retriever for the
    task's experience instead (the trainer's experience plan sets it); ``train_mode`` ``discard`` strips the
    experience from the trained samples (their ``exp_mask`` is then True: trained in a context other than
    the one they were generated in). ``tool_selection`` picks local tools (None = all, [] = none).

    ``task`` is the task as the task manager wrote it, and the object graders score: a training row's
    :class:`TaskObjective` gives it unchanged (:meth:`for_objective`). ``task_id`` is the environment task the
    instance is created from (a synthetic task's seed) and ``query`` the task message that replaces the
    environment's. A spec made from fields alone (the rollout CLI, tests) gets the environment's task
    ``Task(task_id, env_type, query)``, graded by the environment.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    task_id: str = Field(min_length=1)
    env_type: str = Field(min_length=1)
    query: str | None = None
    group_id: str = Field(min_length=1)
    rollout_id: int = Field(default=0, ge=0)
    experience: str | None = None
    add_experience: bool = False
    train_mode: Literal["keep", "discard"] = "keep"
    tool_selection: Any = None
    env_params: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    task: Task | None = None  # never None after validation (see the class docstring)

    @property
    def played_task(self) -> dict[str, Any] | None:
        """What the episode was asked, when it is not the environment's own task (a synthetic task played
        on its seed's id): ``{task_id, query, ground_truth}``, kept in the episode's record so that the
        environment can label its steps (``/step_labels`` with ``params.task``); None otherwise."""
        if self.task is None or self.task.task_id == self.task_id:
            return None
        return {"task_id": self.task.task_id, "query": self.task.query, "ground_truth": self.task.ground_truth}

    @model_validator(mode="after")
    def _environment_task(self) -> EpisodeSpec:
        if self.task is None:
            self.task = Task(task_id=self.task_id, env_type=self.env_type, query=self.query)
        return self

    @classmethod
    def for_objective(cls, objective: TaskObjective, *, group_id: str, rollout_id: int = 0,
                      env_params: Mapping[str, Any] | None = None, **fields: Any) -> EpisodeSpec:
        """The episode of one rollout of ``objective``; ``fields`` are the rest of the spec (experience plan)."""
        task = objective.task
        return cls(task_id=objective.instance_task_id, env_type=task.env_type, query=task.query, task=task,
                   group_id=group_id, rollout_id=rollout_id, env_params=dict(env_params or {}), **fields)


class EpisodeResult(BaseModel):
    """The outcome of one episode (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    env_type: str
    group_id: str
    rollout_id: int
    instance_id: str | None = None
    termination: Termination
    error: str | None = None
    num_turns: int = 0
    reward: Reward = Field(default_factory=Reward)
    samples: list[Sample] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    #: :attr:`EpisodeSpec.played_task` of the episode's spec; None for the environment's own task.
    played_task: dict[str, Any] | None = None
    #: A game's seats and moves (:mod:`agentevolver.module.agent_flow.game`): ``seats`` (per seat: ``seat``,
    #: ``player``, ``trained``, ``score``, ``success``, ``failure``, ``error``, ``samples`` = indices into
    #: :attr:`samples`, ``messages``), ``moves``, ``scores``, ``summary``; None for any other episode.
    game: dict[str, Any] | None = None

    @property
    def final_sample(self) -> Sample | None:
        """The sample holding the episode's last generation (the only one for append-only managers)."""
        return self.samples[-1] if self.samples else None

    @property
    def failure(self) -> str | None:
        """The service whose failure leaves this episode without a trustworthy reward, or None.

        ``env`` - the environment failed (``env_error``, or /evaluate failed); ``program`` - an agent program
        (``agent_program``) raised, hung, gave an unusable reward or made no call; ``rollout`` - anything else
        ended it (``error``: the rollout server, a bug); ``grader`` - the task's grader could not judge it.
        The trainer keeps such episodes out of the update (:mod:`agentevolver.verl.step.faults`).
        """
        if self.termination == "env_error" or self.metrics.get("episode/evaluate_errors", 0.0) > 0:
            return "env"
        if self.metrics.get("episode/program_failed", 0.0) > 0:
            return "program"
        if self.termination == "error":
            return "rollout"
        if self.metrics.get("grader/errors", 0.0) > 0:
            return "grader"
        return None

    @property
    def success(self) -> bool:
        """True when the environment's score reached ``agent_flow.success_threshold``."""
        return self.reward.success_rate >= 1.0

    def to_dump_record(
        self, *, step: int, advantages: list[float] | None = None, include_messages: bool = True
    ) -> dict[str, Any]:
        """One JSON object for ``<run dir>/rollouts/step_<N>.jsonl`` (format: docs/rollout_dumps.md).

        Token fields are those of :attr:`final_sample`; a multi-sample episode (``self_clip``, ``memory``,
        ``linear_think``) lists its earlier samples under ``other_samples`` with the same token fields.
        """
        record: dict[str, Any] = {
            "step": step,
            "task_id": self.task_id,
            "env_type": self.env_type,
            "group_id": self.group_id,
            "rollout_id": self.rollout_id,
            "instance_id": self.instance_id,
            "termination": self.termination,
            "error": self.error,
            "failure": self.failure,
            "num_turns": self.num_turns,
            "reward": self.reward.model_dump(),
            "success": self.success,
            "metrics": self.metrics,
            "played_task": self.played_task,
        }
        record.update(_token_fields(self.final_sample))
        record["other_samples"] = [_token_fields(sample) for sample in self.samples[:-1]]
        record["advantages"] = advantages
        if self.game is not None:
            record["game"] = self.game
        if include_messages:
            record["messages"] = self.messages
        return record


def _token_fields(sample: Sample | None) -> dict[str, Any]:
    if sample is None:
        return {"prompt_ids": [], "response_ids": [], "response_mask": [], "response_logprobs": None,
                "step_ids": [], "exp_mask": False, "experience_span": None, "experience_span_generated": None}
    return {
        "prompt_ids": sample.prompt_ids,
        "response_ids": sample.response_ids,
        "response_mask": sample.response_mask,
        "response_logprobs": sample.response_logprobs,
        "step_ids": sample.step_ids,
        "exp_mask": sample.exp_mask,
        "experience_span": sample.extras.get("experience_span"),
        # Where the experience was in the prompt the tokens were generated from (stripped samples only).
        "experience_span_generated": sample.extras.get("experience_span_generated"),
    }
