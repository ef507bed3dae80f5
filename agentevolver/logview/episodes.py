"""Turn one dump record into what the pages show: a table row, the conversation and the token view.

Records come from disk and may be old, hand-edited or from a newer writer, so every field is optional
here: a missing field is simply absent from the page, and a field of the wrong type is dropped with a
problem naming it (pydantic does the checking, and its error locations become the field names shown).
Fields from later features are shown when present: ``advantages`` (trainer dumps), ``experience_span``
and ``experience`` messages (Self-Navigating), ``step_flags`` (Self-Attributing's per-step GOOD/BAD).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "EpisodeRow",
    "RecordView",
    "Token",
    "advantage_range",
    "episode_row",
    "parse_record",
    "split_opening",
    "step_label",
    "token_rows",
]


class RewardView(BaseModel):
    model_config = ConfigDict(extra="allow")

    outcome: float | None = None
    success_rate: float | None = None
    madness: float | None = None
    description: str | None = None


class TokenFields(BaseModel):
    """The token fields a record (and each of its ``other_samples``) carries."""

    model_config = ConfigDict(extra="allow")

    prompt_ids: list[int] = []
    response_ids: list[int] = []
    response_mask: list[int] = []
    response_logprobs: list[float] | None = None
    step_ids: list[int] = []
    exp_mask: bool = False
    experience_span: tuple[int, int] | None = None


class RecordView(TokenFields):
    """One episode as the viewer reads it (docs/rollout_dumps.md lists the fields)."""

    step: int | None = None
    task_id: str | None = None
    env_type: str | None = None
    group_id: str | None = None
    rollout_id: int | None = None
    instance_id: str | None = None
    termination: str | None = None
    error: str | None = None
    num_turns: int | None = None
    reward: RewardView | None = None
    success: bool | None = None
    metrics: dict[str, float] = {}
    other_samples: list[TokenFields] = []
    advantages: list[float] | None = None
    messages: list[dict[str, Any]] | None = None
    step_flags: list[bool | str | None] | None = None


def _field_name(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def parse_record(raw: dict[str, Any]) -> tuple[RecordView, list[str]]:
    """The record as a :class:`RecordView`; fields of the wrong type are dropped and named in the problems."""
    data = dict(raw)
    problems: list[str] = []
    for _ in range(len(data) + 1):
        try:
            view = RecordView.model_validate(data)
            break
        except ValidationError as err:
            bad = {error["loc"][0] for error in err.errors() if error["loc"]}
            for error in err.errors():
                problems.append(f"field {_field_name(error['loc'])!r}: {error['msg']} "
                                f"(got {str(error.get('input'))[:60]!r}); not shown")
            if not bad:
                raise
            for name in bad:
                data.pop(name, None)
    problems.extend(_alignment_problems(view))
    return view, problems


def _alignment_problems(view: TokenFields) -> list[str]:
    n = len(view.response_ids)
    problems = [f"field {name!r} has {len(values)} entries but response_ids has {n}"
                for name, values in (("response_mask", view.response_mask), ("step_ids", view.step_ids),
                                     ("response_logprobs", view.response_logprobs or []))
                if values and len(values) != n]
    advantages = getattr(view, "advantages", None)
    if advantages is not None and len(advantages) != n:
        problems.append(f"field 'advantages' has {len(advantages)} entries but response_ids has {n}")
    return problems


def step_label(flag: bool | str | None) -> str | None:
    """``GOOD``/``BAD`` for a step flag (True/False or the strings, any case); None when unlabelled."""
    if isinstance(flag, bool):
        return "GOOD" if flag else "BAD"
    if isinstance(flag, str) and flag.strip().upper() in ("GOOD", "BAD"):
        return flag.strip().upper()
    return None


def experience_used(view: RecordView) -> bool:
    """The episode's context carried retrieved experience (span recorded, or an experience message)."""
    if view.experience_span is not None or view.exp_mask:
        return True
    return any(message.get("author") == "experience" for message in view.messages or [])


@dataclass
class EpisodeRow:
    """One line of a step's table."""

    line: int
    task_id: str
    group: str
    reward: float | None
    success: bool | None
    turns: int | None
    termination: str
    error: str | None
    experience: bool
    good: int
    bad: int
    labelled: bool
    policy_tokens: int
    problems: list[str] = field(default_factory=list)


def episode_row(line: int, raw: dict[str, Any]) -> EpisodeRow:
    view, problems = parse_record(raw)
    labels = [step_label(flag) for flag in view.step_flags or []]
    success = view.success
    if success is None and view.reward is not None and view.reward.success_rate is not None:
        success = view.reward.success_rate >= 1.0
    group = view.group_id or "?"
    if view.rollout_id is not None:
        group = f"{group} #{view.rollout_id}"
    return EpisodeRow(
        line=line, task_id=view.task_id or "?", group=group,
        reward=view.reward.outcome if view.reward is not None else None, success=success, turns=view.num_turns,
        termination=view.termination or "?", error=view.error, experience=experience_used(view),
        good=labels.count("GOOD"), bad=labels.count("BAD"), labelled=view.step_flags is not None,
        policy_tokens=sum(view.response_mask), problems=problems,
    )


@dataclass
class Token:
    """One token of the token view. ``kind``: prompt, policy (mask 1) or observation (mask 0 in the response)."""

    position: int
    token_id: int
    text: str | None
    kind: str
    experience: bool = False
    step: int | None = None
    label: str | None = None
    logprob: float | None = None
    advantage: float | None = None

    @property
    def title(self) -> str:
        parts = [f"#{self.position}", f"id {self.token_id}", self.kind + (" (experience)" if self.experience else "")]
        if self.step is not None:
            parts.append(f"step {self.step}" + (f" {self.label}" if self.label else ""))
        if self.logprob is not None and self.kind == "policy":
            parts.append(f"logprob {self.logprob:.3f}")
        if self.advantage is not None:
            parts.append(f"advantage {self.advantage:+.4f}")
        return " · ".join(parts)


def token_rows(sample: TokenFields, texts: list[str] | None, *, advantages: list[float] | None,
               labels: list[str | None]) -> list[Token]:
    """Prompt then response tokens with their mask, step, label, logprob and advantage (where known)."""
    prompt, response = sample.prompt_ids, sample.response_ids
    span = sample.experience_span
    tokens: list[Token] = []
    for index, token_id in enumerate(prompt):
        tokens.append(Token(index, token_id, texts[index] if texts else None, "prompt",
                            experience=span is not None and span[0] <= index < span[1]))
    mask, steps = sample.response_mask, sample.step_ids
    logprobs = sample.response_logprobs
    for index, token_id in enumerate(response):
        position = len(prompt) + index
        policy = index < len(mask) and mask[index] == 1
        step = steps[index] if index < len(steps) and steps[index] >= 0 else None
        tokens.append(Token(
            position, token_id, texts[position] if texts else None, "policy" if policy else "observation",
            step=step, label=labels[step] if step is not None and step < len(labels) else None,
            logprob=logprobs[index] if logprobs and index < len(logprobs) else None,
            advantage=advantages[index] if advantages and index < len(advantages) else None,
        ))
    return tokens


def split_opening(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(collapsible opening, the rest): the system prompt and demonstrations before the task message.

    The opening of a tool environment is long (calc: a system prompt and eight worked examples), and the
    reader wants the task and what the agent did; the task message and the spans joined to it (injected
    experience) stay visible.
    """
    first = next((i for i, m in enumerate(messages) if str(m.get("author", "")).startswith("llm")), len(messages))
    keep = first
    while keep > 0 and messages[keep - 1].get("join_previous"):
        keep -= 1
    keep = max(keep - 1, 0)
    return messages[:keep], messages[keep:]


def advantage_range(sample: TokenFields, advantages: list[float] | None) -> tuple[float, float] | None:
    """Min and max advantage over the policy tokens (GRPO: one value per episode, so min == max)."""
    if not advantages:
        return None
    values = [a for a, m in zip(advantages, sample.response_mask, strict=False) if m == 1]
    return (min(values), max(values)) if values else None
