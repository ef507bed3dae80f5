"""What the agent flow builds from the ``agent_flow.tools`` section (:class:`~agentevolver.config.agent_flow.ToolsConfig`).

The section is plain config data; these functions turn it into the parser, the episode's tool set, the
arguments of each execution and the episode reward, so every reader applies the keys the same way.
"""

from __future__ import annotations

from typing import Any

from agentevolver.config.agent_flow import ToolsConfig
from agentevolver.errors import ConfigError
from agentevolver.module.tools.parsing import ToolCallParser, build_parser
from agentevolver.module.tools.registry import ToolRegistry
from agentevolver.module.tools.rewards import fold_tool_rewards
from agentevolver.module.tools.toolset import ToolSet

__all__ = ["ToolsConfig", "execute_kwargs", "fold_rewards", "make_parser", "parser_for_key", "toolset"]


def make_parser(config: ToolsConfig) -> ToolCallParser:
    """The configured parser (parsers are stateless; one may serve many episodes)."""
    return parser_for_key(config.tool_parser)


def parser_for_key(spec: Any) -> ToolCallParser:
    """The parser ``agent_flow.tools.tool_parser`` names; a bad name or option is a :class:`ConfigError`
    naming that key (the start-up check and :func:`make_parser` both go through here)."""
    try:
        return build_parser(spec)
    except ConfigError as err:
        raise ConfigError(f"agent_flow.tools.tool_parser: {str(err).removeprefix('tool_parser: ')}") from err


def toolset(config: ToolsConfig, registry: ToolRegistry, episode_id: str, tool_selection: Any = None) -> ToolSet:
    """The episode's :class:`ToolSet` with the section's truncation settings."""
    return registry.toolset(episode_id, tool_selection=tool_selection, max_chars=config.max_tool_response_chars,
                            truncate_side=config.truncate_side)


def execute_kwargs(config: ToolsConfig) -> dict[str, Any]:
    """Keyword arguments for :meth:`ToolSet.execute`: ``timeout_s`` and ``max_parallel_calls``."""
    return {"timeout_s": config.tool_timeout_s, "max_parallel_calls": config.max_parallel_calls}


def fold_rewards(config: ToolsConfig, episode_reward: float, tool_rewards: list[float]) -> float:
    """The episode reward with the tool rewards folded in by ``tool_reward_mode``."""
    return fold_tool_rewards(episode_reward, tool_rewards, config.tool_reward_mode)
