"""calc's exploration seeds (split ``explore``): ``explore-calculator`` and ``explore-convert_units``.

A seed is played like a task (same system prompt, demonstrations and tools) but asks the agent to find out
what a tool can do; it has no answer, so ``/evaluate`` scores it 0 (its answer is NaN, which no value is
within tolerance of). Self-Questioning explores them to write tasks when no human task is given
(:mod:`env_service.environments.exploration_seeds`).
"""

from __future__ import annotations

from functools import cache

from env_service.environments.calc.tasks import CalcTask, get_task
from env_service.environments.calc.tools import tool_schemas
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, is_seed, tool_seeds

__all__ = ["SEED_LEVEL", "calc_task", "seed_task_ids"]

#: The level a seed reports in ``/get_info`` (it is none of calc's task levels).
SEED_LEVEL = "seed"


@cache
def _seeds() -> dict[str, CalcTask]:
    return {task_id: CalcTask(task_id=task_id, split=EXPLORE_SPLIT, level=SEED_LEVEL, query=query,
                              answer=float("nan"), tolerance=0.0, solution={"name": "", "arguments": {}})
            for task_id, query in tool_seeds(tool_schemas()).items()}


def seed_task_ids() -> list[str]:
    """The seed ids, one per tool, in the tools' order."""
    return list(_seeds())


def calc_task(task_id: str) -> CalcTask:
    """The seed ``task_id`` names, or calc's task of that id (:func:`~.tasks.get_task`, which names a bad id)."""
    seed = _seeds().get(task_id) if is_seed(task_id) else None
    return seed if seed is not None else get_task(task_id)
