"""The ``agent_flow`` config section: how one episode runs.

Defined and documented in config/agentevolver.yaml; this model enforces types and ranges once at start-up
and carries the same defaults, so code and tests can build a config without Hydra. Token budgets of the
context (window, prompt cap, response cap) are *not* here: they are verl's ``data.max_prompt_length`` and
``actor_rollout_ref.rollout.response_length``, because verl pads the batch to exactly those sizes and an
episode that outgrew them could not be trained. :meth:`AgentFlowConfig.context_config` joins the two.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentevolver.module.context_manager import ContextManagerConfig, context_manager_names
from agentevolver.module.context_manager import ContextOptions as BaseContextOptions
from agentevolver.module.tools import ToolsConfig

__all__ = ["AgentFlowConfig", "ContextOptions", "DumpConfig", "MadnessConfig"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContextOptions(BaseContextOptions):
    """``agent_flow.context``: the context manager's options (budgets come from verl's lengths, see module doc);
    a turn needs 8 free tokens by default, so an episode ends instead of generating a few tokens at the edge."""

    min_generation_tokens: int = Field(default=8, ge=1)


class MadnessConfig(_Model):
    """``agent_flow.madness``: repetition ("madness") detection on each generation."""

    enable: bool = True
    ngram_size: int = Field(default=4, ge=1)
    min_tokens: int = Field(default=48, ge=2)
    max_repeat_ratio: float = Field(default=0.6, gt=0.0, lt=1.0)
    penalize: bool = True
    penalty_reward: float = -1.0
    terminate: bool = False


class DumpConfig(_Model):
    """``agent_flow.dump``: where and whether each step's episodes are written as JSON lines."""

    enable: bool = True
    dir: str | None = None
    include_messages: bool = True


class AgentFlowConfig(_Model):
    """``agent_flow``: the episode loop's knobs (see config/agentevolver.yaml for each key's meaning)."""

    context_template: str = "linear"
    max_steps: int = Field(default=30, ge=1)
    max_tokens_per_turn: int | None = Field(default=1024, ge=1)
    on_parse_error: Literal["feedback", "env", "terminate"] = "feedback"
    max_parse_errors: int = Field(default=3, ge=1)
    max_env_errors: int = Field(default=3, ge=1)
    episode_retries: int = Field(default=2, ge=0)
    episode_retry_backoff_s: float = Field(default=5.0, ge=0)
    max_failed_share: float = Field(default=0.5, ge=0, le=1)
    sparse_reward: bool = True
    success_threshold: float = 1.0
    tool_modules: list[str] = Field(default_factory=list)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    context: ContextOptions = Field(default_factory=ContextOptions)
    madness: MadnessConfig = Field(default_factory=MadnessConfig)
    dump: DumpConfig = Field(default_factory=DumpConfig)

    @field_validator("context_template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        names = context_manager_names()
        if value not in names:
            raise ValueError(f"must be one of {', '.join(names)}; got {value!r}")
        return value

    def context_config(
        self, *, max_model_len: int, max_prompt_len: int | None = None, max_response_len: int | None = None
    ) -> ContextManagerConfig:
        """The context manager's config: this section's options plus the token budgets of the run."""
        return ContextManagerConfig(
            max_model_len=max_model_len,
            max_prompt_len=max_prompt_len,
            max_response_len=max_response_len,
            **self.context.model_dump(),
        )
