"""The knobs of a context manager, validated once when it is made.

One flat model serves every context manager (the config names one with ``context_template``); each field
says which managers read it. Budgets are in tokens of the policy's tokenizer, never characters, because
the window the model sees and the tensors the trainer pads are counted in tokens.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DEFAULT_CLIPPER_PROMPT", "DEFAULT_THINK_HINT", "ContextManagerConfig", "ContextOptions"]

#: Appended to the last message of every ``linear_think`` context (the reference's "think first" nudge).
DEFAULT_THINK_HINT = (
    "\n\nFirst think step by step inside <think>...</think>, then give your action after </think>."
)

#: System prompt of the ``self_clip`` archivist (the ``context_clipper`` LLM role).
DEFAULT_CLIPPER_PROMPT = (
    "You archive the early part of an agent's interaction with an environment so the agent can continue "
    "with a shorter context. Write a concise markdown summary of the turns you are given: what the agent "
    "tried, what the environment answered, facts learned (names, ids, values, file paths), and what is "
    "still left to do. Keep every detail the agent may need later; drop pleasantries and repetition. "
    "Answer with the summary only."
)


class ContextOptions(BaseModel):
    """Per-manager options, without the token budgets (the ``agent_flow.context`` config section holds these;
    its budgets come from the run's lengths)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Environment/tool message content is clipped to this many tokens, marker included. None = no clip (all).
    max_env_len: int | None = Field(default=4096, ge=1)
    #: Marker that replaces the clipped tail of a long observation; ``{n}`` = tokens removed (all).
    env_clip_marker: str = "\n...[{n} tokens truncated]"
    #: A generation needs at least this many free tokens; below it the manager reports ``exhausted`` (all).
    min_generation_tokens: int = Field(default=1, ge=1)
    #: Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. ``enable_thinking``) (all).
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: Text appended to the last message of each context (``linear_think``); "" disables the hint.
    think_hint: str = DEFAULT_THINK_HINT
    #: Characters kept per action / observation in the running memory (``memory``).
    memory_entry_chars: int = Field(default=400, ge=16)
    #: Archive old turns when the next context would exceed this share of ``max_model_len`` (or of
    #: ``max_response_len`` for the response part) (``self_clip``).
    clip_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    #: Most recent turns kept verbatim when archiving (``self_clip``).
    keep_last_turns: int = Field(default=1, ge=0)
    #: System prompt of the archivist LLM (``self_clip``).
    clipper_prompt: str = DEFAULT_CLIPPER_PROMPT

    @field_validator("env_clip_marker")
    @classmethod
    def _marker_counts(cls, value: str) -> str:
        if "{n}" not in value:
            raise ValueError("env_clip_marker must contain '{n}' (the number of tokens removed)")
        return value


class ContextManagerConfig(ContextOptions):
    """Budgets and per-manager options (all token counts use the policy tokenizer)."""

    #: Window of the policy: prompt + response of every sample, and every prompt sent to generation (all).
    max_model_len: int = Field(default=8192, ge=2)
    #: Cap on the response part of one sample: generated AND observation tokens (verl's ``response_length``).
    #: None = only ``max_model_len`` limits it (all).
    max_response_len: int | None = Field(default=None, ge=1)
    #: Cap on the prompt of a sample that starts a fresh context (the first one, or one after history was
    #: rewritten). None = only ``max_model_len`` limits it (all).
    max_prompt_len: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _budgets_fit(self) -> ContextManagerConfig:
        """A cap larger than the window can never bind; say so instead of silently ignoring it."""
        for key in ("max_response_len", "max_prompt_len"):
            value = getattr(self, key)
            if value is not None and value >= self.max_model_len:
                raise ValueError(f"{key} ({value}) must be below max_model_len ({self.max_model_len})")
        return self
