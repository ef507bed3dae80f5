"""How the step rewards tools return enter the episode reward (``tool_reward_mode``).

In verl tool rewards only land in ``extra_fields["tool_rewards"]`` and never reach the PPO reward unless a
custom reward manager sums them (seed 001, section 16). Here the choice is a config value applied by one
pure function the agent flow calls once per episode:

* ``ignore``: the episode reward is the environment's/grader's alone (tool rewards are still recorded);
* ``sum``: every tool reward of the episode is added;
* ``last``: only the most recent tool reward is added (for tools whose reward already measures progress).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentevolver.config.agent_flow import TOOL_REWARD_MODES, ToolRewardMode
from agentevolver.errors import ConfigError

__all__ = ["TOOL_REWARD_MODES", "ToolRewardMode", "fold_tool_rewards", "validate_reward_mode"]


def validate_reward_mode(mode: Any, key: str = "tool_reward_mode") -> ToolRewardMode:
    """Return ``mode`` if it is ignore/sum/last, else raise ConfigError naming ``key``."""
    if mode not in TOOL_REWARD_MODES:
        raise ConfigError(f"{key} must be one of {', '.join(TOOL_REWARD_MODES)}; got {mode!r}")
    return mode


def fold_tool_rewards(episode_reward: float, tool_rewards: Sequence[float], mode: ToolRewardMode) -> float:
    """The episode reward after folding in ``tool_rewards`` (in call order) according to ``mode``."""
    validate_reward_mode(mode)
    if mode == "ignore" or not tool_rewards:
        return float(episode_reward)
    if mode == "sum":
        return float(episode_reward) + float(sum(tool_rewards))
    return float(episode_reward) + float(tool_rewards[-1])
