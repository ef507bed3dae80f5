"""Exploration seeds: what Self-Questioning explores when a person has written no task at all.

Why: the task manager explores *from* a task (an instance to act in, a question as context). An environment
whose only tasks are evaluation tasks, or that has none yet, would leave it nothing to start from but the
evaluation set, which must never seed synthetic tasks. So every built-in environment lists, in the split
:data:`EXPLORE_SPLIT`, one seed per tool, ``explore-<tool>`` ("find out what the tool can do"): not a task (no
answer; ``/evaluate`` scores it 0), only a place to start. ``task_manager.seed_split: explore`` explores them
(examples/calc_self_questioning.yaml); ``mcp`` without a task file lists the same seeds as its train split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["EXPLORE_SPLIT", "SEED_PREFIX", "is_seed", "seed_id", "seed_query", "seed_tool", "tool_seeds"]

#: The split every built-in environment lists its exploration seeds in.
EXPLORE_SPLIT = "explore"
#: Seed ids are ``explore-<tool>``.
SEED_PREFIX = "explore-"


def seed_id(tool: str) -> str:
    """The id of the exploration seed of ``tool``."""
    return f"{SEED_PREFIX}{tool}"


def is_seed(task_id: str) -> bool:
    """Whether ``task_id`` names an exploration seed (not a task)."""
    return task_id.startswith(SEED_PREFIX)


def seed_tool(task_id: str) -> str:
    """The tool an exploration seed id names (``explore-calculator`` -> ``calculator``)."""
    return task_id.removeprefix(SEED_PREFIX)


def seed_query(tool: str, description: str) -> str:
    """The question a seed opens with: explore the tool, then report (there is nothing to get right)."""
    summary = description.strip().splitlines()[0] if description.strip() else "no description"
    return (f"Find out what the tool `{tool}` can do ({summary}): call it with sensible arguments, "
            "then report what you learned.")


def tool_seeds(schemas: Sequence[dict[str, Any]] | None) -> dict[str, str]:
    """Seed id -> opening question, one per tool of ``schemas`` (OpenAI function format), in their order."""
    seeds: dict[str, str] = {}
    for schema in schemas or []:
        function = schema.get("function", schema)
        name = str(function.get("name", "")).strip()
        if name:
            seeds[seed_id(name)] = seed_query(name, str(function.get("description", "")))
    return seeds
