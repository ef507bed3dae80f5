"""Environment-grounded step labels: the optional ``step_labels`` capability of the environment service.

Where an environment can tell a good step from a bad one itself (``calc`` knows what its question asks
for), it labels the steps of a finished episode GOOD/BAD, so Self-Attributing (ADCA) can train on labels
that a small LLM judge cannot give (``attribution_driven_credit_assignment.judge.source: env``) or measure
how often its judge agrees with them. The route is ``POST /step_labels`` with the usual envelope; an
environment advertises the capability at ``GET /envs/{env_type}/capabilities``. Client and service both
use the models below, so they cannot drift. Wire format and errors: docs/env_service.md.

What a *step* is, here as in the agent flow and the ADCA judge: one assistant turn. The agent flow records
every message of an episode with the ``step`` it belongs to (``-1`` before the first step; see
docs/rollout_dumps.md); :func:`split_steps` groups by that field, so label ``j`` is about the agent's
generation ``j`` and lines up with the step ids of its tokens. Messages without ``step`` fields are read as
"each assistant message after the opening is one step".

The instance of the episode is not needed (it is released when the episode ends): the environment labels
from the task id and the messages alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, model_validator

from agentevolver.schema.env_wire import EnvRequest
from agentevolver.schema.message import ChatMessage

__all__ = [
    "STEP_LABELS",
    "AgentStep",
    "EnvCapabilities",
    "EpisodeSteps",
    "StepLabel",
    "StepLabelsData",
    "StepLabelsRequest",
    "message_step",
    "split_steps",
    "wire_messages",
]

#: The capability name an environment lists when it implements ``label_steps``.
STEP_LABELS: Final = "step_labels"
#: Authors (agent-flow ``author`` field) whose messages are the agent's own, whatever their role.
_AGENT_AUTHORS = frozenset({"llm", "llm(do_not_train)"})


class StepLabelsRequest(EnvRequest):
    """``/step_labels``: label every step of a finished episode of ``task_id``.

    ``messages`` is the whole conversation as the agent flow recorded it (each message may carry ``step``:
    the agent turn it belongs to, -1 = before the first); no live instance is involved.
    """

    env_type: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)  # type: ignore[assignment]


class StepLabel(BaseModel):
    """The environment's verdict on one step: GOOD or BAD, and why (for logs and the trajectory viewer)."""

    step: int = Field(ge=0)
    label: Literal["GOOD", "BAD"]
    reason: str = ""

    @property
    def good(self) -> bool:
        """True for GOOD: the form ADCA's step flags take."""
        return self.label == "GOOD"


class StepLabelsData(BaseModel):
    """``/step_labels`` data: one label per step, steps 0..K-1 in order."""

    env_type: str
    task_id: str
    labels: list[StepLabel]

    @model_validator(mode="after")
    def _steps_in_order(self) -> StepLabelsData:
        steps = [label.step for label in self.labels]
        if steps != list(range(len(steps))):
            raise ValueError(f"labels must cover steps 0..{len(steps) - 1} in order; got steps {steps}")
        return self

    @property
    def flags(self) -> list[bool]:
        """The labels as ADCA step flags (True = GOOD)."""
        return [label.good for label in self.labels]


class EnvCapabilities(BaseModel):
    """``GET /envs/{env_type}/capabilities`` data: the optional behaviours the environment offers."""

    env_type: str
    capabilities: list[str]


@dataclass
class AgentStep:
    """One agent turn: the assistant message(s) of the turn and the messages that answered it."""

    index: int
    actions: list[ChatMessage] = field(default_factory=list)
    observations: list[ChatMessage] = field(default_factory=list)


@dataclass
class EpisodeSteps:
    """An episode's messages split into the opening (``context``: system, task, demonstrations,
    experience) and its agent steps, in order; ``tagged`` says whether ``step`` fields decided it."""

    context: list[ChatMessage]
    steps: list[AgentStep]
    tagged: bool


def message_step(message: ChatMessage, position: int) -> int | None:
    """The ``step`` a message carries (None when it carries none); a non-integer is an error naming
    ``messages.<position>.step``."""
    extra = message.model_extra or {}
    if "step" not in extra or extra["step"] is None:
        return None
    value = extra["step"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"messages.{position}.step must be an integer (the agent turn, -1 before the first); "
                         f"got {value!r}")
    return value


def _is_action(message: ChatMessage) -> bool:
    author = (message.model_extra or {}).get("author")
    return message.role == "assistant" or author in _AGENT_AUTHORS


def split_steps(messages: Sequence[ChatMessage], *, opening_end: int | None = None) -> EpisodeSteps:
    """Group an episode's messages into agent steps (one assistant turn = one step).

    With ``step`` fields (what the agent flow records), step j holds the messages tagged j (assistant ones
    are its actions, the rest its observations) and untagged or negative-tagged messages are the opening;
    steps run 0..max tag, a tag without an assistant message still counting as a step (it has no action).
    Without any ``step`` field, the opening is ``messages[:opening_end]`` (default: everything before the
    first assistant message; an environment whose opening holds demonstration turns passes where its
    opening ends) and every later assistant message starts the next step. Raises ValueError naming the
    message whose ``step`` is not an integer.
    """
    tags = [message_step(message, position) for position, message in enumerate(messages)]
    if any(tag is not None for tag in tags):
        count = max((tag for tag in tags if tag is not None and tag >= 0), default=-1) + 1
        steps = [AgentStep(index) for index in range(count)]
        context: list[ChatMessage] = []
        for message, tag in zip(messages, tags, strict=True):
            if tag is None or tag < 0:
                context.append(message)
            elif _is_action(message):
                steps[tag].actions.append(message)
            else:
                steps[tag].observations.append(message)
        return EpisodeSteps(context=context, steps=steps, tagged=True)
    if opening_end is None:
        opening_end = next((i for i, message in enumerate(messages) if _is_action(message)), len(messages))
    context, steps = list(messages[:opening_end]), []
    for message in messages[opening_end:]:
        if _is_action(message):
            steps.append(AgentStep(len(steps), actions=[message]))
        elif steps:
            steps[-1].observations.append(message)
        else:
            context.append(message)
    return EpisodeSteps(context=context, steps=steps, tagged=False)


def wire_messages(messages: Sequence[ChatMessage | dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as ``/step_labels`` sends them: JSON dicts without null fields."""
    out = []
    for message in messages:
        data = message.model_dump(mode="json", exclude_none=True) if isinstance(message, ChatMessage) \
            else {key: value for key, value in dict(message).items() if value is not None}
        out.append(data)
    return out
