"""The tool knobs of an experiment, validated once at start-up.

Field names are the config keys this layer expects (see docs/tools.md); the model forbids unknown keys and
checks each value's range, and ``tool_parser`` is built once here so an unknown parser name fails before
any rollout. The agent flow reads a ToolsConfig and calls :meth:`make_parser`, :meth:`toolset` and
:meth:`fold_rewards`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentevolver.module.tools.parsing import ToolCallParser, build_parser
from agentevolver.module.tools.registry import ToolRegistry
from agentevolver.module.tools.rewards import ToolRewardMode, fold_tool_rewards
from agentevolver.module.tools.toolset import ToolSet
from agentevolver.module.tools.truncation import TruncateSide

__all__ = ["ToolsConfig"]


class ToolsConfig(BaseModel):
    """Tool parsing and execution settings (defaults mirror verl's where verl has one)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Parser name, ``{"name": ..., **options}``, or a list of those (composite, applied in order).
    tool_parser: str | dict[str, Any] | list[str | dict[str, Any]] = "hermes"
    #: Calls run per assistant turn; later ones are answered "not run". None = no limit. verl's default is 1.
    max_parallel_calls: int | None = Field(default=1, ge=1)
    #: Per-call timeout in seconds (class-tool creation included). None = no timeout.
    tool_timeout_s: float | None = Field(default=30.0, gt=0)
    #: Observation cap in characters, marker included. None = no cap.
    max_tool_response_chars: int | None = Field(default=4096, ge=1)
    #: Which part of a long observation is cut: left (keep the end), right (keep the start), middle.
    truncate_side: TruncateSide = "middle"
    #: How tool step rewards enter the episode reward: ignore, sum, last.
    tool_reward_mode: ToolRewardMode = "ignore"
    #: Render the tool schemas into the prompt (the chat template's ``tools`` block). False when the
    #: environment's own prompt already teaches the call format: on ``calc`` the block is ~320 tokens of each
    #: prompt, which the update's forward and backward passes pay for in every sample. Parsing and the
    #: env/local name-clash check still use the schemas.
    schemas_in_prompt: bool = True

    @field_validator("tool_parser")
    @classmethod
    def _parser_exists(cls, value: Any) -> Any:
        """Build the parser once so an unknown name or bad option is reported with the config."""
        build_parser(value)
        return value

    def make_parser(self) -> ToolCallParser:
        """A parser instance as configured (parsers are stateless; one may serve many episodes)."""
        return build_parser(self.tool_parser)

    def toolset(self, registry: ToolRegistry, episode_id: str, tool_selection: Any = None) -> ToolSet:
        """The episode's :class:`ToolSet` with this config's truncation settings."""
        return registry.toolset(
            episode_id,
            tool_selection=tool_selection,
            max_chars=self.max_tool_response_chars,
            truncate_side=self.truncate_side,
        )

    def execute_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :meth:`ToolSet.execute`: ``timeout_s`` and ``max_parallel_calls``."""
        return {"timeout_s": self.tool_timeout_s, "max_parallel_calls": self.max_parallel_calls}

    def fold_rewards(self, episode_reward: float, tool_rewards: list[float]) -> float:
        """The episode reward with the tool rewards folded in by ``tool_reward_mode``."""
        return fold_tool_rewards(episode_reward, tool_rewards, self.tool_reward_mode)
