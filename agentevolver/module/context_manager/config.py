"""The knobs of a context manager, validated once when it is made.

The per-manager options are config data (:class:`agentevolver.config.agent_flow.ContextOptions`, the
``agent_flow.context`` section); this model adds the run's token budgets. One flat model serves every
context manager (the config names one with ``context_template``); each field says which managers read it. Budgets are in tokens of the policy's tokenizer, never characters, because
the window the model sees and the tensors the trainer pads are counted in tokens.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from agentevolver.config.agent_flow import DEFAULT_CLIPPER_PROMPT, DEFAULT_THINK_HINT, ContextOptions

__all__ = ["DEFAULT_CLIPPER_PROMPT", "DEFAULT_THINK_HINT", "ContextManagerConfig", "ContextOptions"]


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
