"""Observation length cap: cut long tool output to ``max_tool_response_chars`` from a chosen side.

Two differences from verl (seed 001, section 14), each deliberate:
* the side is validated (verl silently treats any typo as ``middle``);
* the cap is hard: the ``...(N chars truncated)...`` marker counts against it, so the result is never
  longer than the cap, and error observations are capped too (verl lets them through uncut).
The cap is in characters; the agent flow's token budget (``max_env_len``) is the token-level guard.
"""

from __future__ import annotations

from typing import Any

from agentevolver.config.agent_flow import TRUNCATE_SIDES, TruncateSide
from agentevolver.errors import ConfigError

__all__ = ["TRUNCATE_SIDES", "TruncateSide", "truncate_text", "validate_max_chars", "validate_truncate_side"]


def validate_truncate_side(side: Any, key: str = "truncate_side") -> TruncateSide:
    """Return ``side`` if it is left/right/middle, else raise ConfigError naming ``key``."""
    if side not in TRUNCATE_SIDES:
        raise ConfigError(f"{key} must be one of {', '.join(TRUNCATE_SIDES)}; got {side!r}")
    return side


def validate_max_chars(max_chars: Any, key: str = "max_tool_response_chars") -> int | None:
    """Return ``max_chars`` if it is None (no cap) or a positive int, else raise ConfigError naming ``key``."""
    if max_chars is None:
        return None
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ConfigError(f"{key} must be a positive integer or null (no cap); got {max_chars!r}")
    return max_chars


def _marker(side: str, removed: int) -> str:
    if side == "left":
        return f"({removed} chars truncated)..."
    if side == "right":
        return f"...({removed} chars truncated)"
    return f"...({removed} chars truncated)..."


def _cut(text: str, keep: int, side: str, marker: str) -> str:
    if side == "left":
        return marker + (text[-keep:] if keep else "")
    if side == "right":
        return text[:keep] + marker
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + marker + (text[-tail:] if tail else "")


def truncate_text(text: str, max_chars: int | None, side: TruncateSide = "middle") -> tuple[str, bool]:
    """Return ``(text cut to at most max_chars, whether it was cut)``; None means no cap."""
    validate_truncate_side(side)
    max_chars = validate_max_chars(max_chars)
    if max_chars is None or len(text) <= max_chars:
        return text, False
    removed = len(text) - max_chars
    for _ in range(4):  # the marker's own length moves the count; it settles within a couple of rounds
        keep = max_chars - len(_marker(side, removed))
        if keep < 0:
            break
        if len(text) - keep == removed:
            return _cut(text, keep, side, _marker(side, removed)), True
        removed = len(text) - keep
    # The cap is shorter than any marker (or the count did not settle): cut without one.
    if side == "left":
        return text[-max_chars:], True
    if side == "right":
        return text[:max_chars], True
    return _cut(text, max_chars, "middle", ""), True
