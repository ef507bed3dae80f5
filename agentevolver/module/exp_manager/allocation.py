"""Who gets experience: the two seeded draws of Self-Navigating (seed 002, section 2).

* **Task level** (training only): each task of the step is ``keep`` (its experience-guided samples are
  trained with the experience in the prompt) or ``discard`` (the experience is stripped before training).
  ``allkeep`` keeps every task, ``alldiscard`` none, ``hybrid`` keeps ``round(n_tasks * keepratio)`` of them.
* **Rollout level**: within one task's group of ``n`` rollouts, ``woexp`` gives no rollout experience,
  ``all`` every rollout, ``mixed`` ``round(n * rollout_ratio)`` of them (the rest explore without it).

Both draws are exact counts shuffled by a generator seeded from ``(seed, split, step)``, so a run is
reproducible, a resumed run draws what the uninterrupted one would have, and train and validation draws
are independent. Counts are rounded (not floored as in the reference) so a small batch is not
systematically short of kept tasks or guided rollouts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["ExperiencePlan", "TrainMode", "allocate_add_experience", "allocate_train_modes", "plan_rows",
           "seeded_rng"]

TrainMode = Literal["keep", "discard"]
SampleMode = Literal["allkeep", "alldiscard", "hybrid"]
RolloutMode = Literal["woexp", "mixed", "all"]


def seeded_rng(seed: int, split: str, step: int) -> random.Random:
    """The generator of one step's draws (string seeding is deterministic across processes and runs)."""
    return random.Random(f"agentevolver-exp:{seed}:{split}:{step}")


def allocate_train_modes(n_tasks: int, mode: SampleMode, keep_ratio: float, rng: random.Random) -> list[TrainMode]:
    """``keep``/``discard`` for each of ``n_tasks`` tasks (see the module docstring)."""
    ratio = {"allkeep": 1.0, "alldiscard": 0.0}.get(mode, keep_ratio)
    keep = min(n_tasks, round(n_tasks * ratio))
    modes: list[TrainMode] = ["keep"] * keep + ["discard"] * (n_tasks - keep)
    rng.shuffle(modes)
    return modes


def allocate_add_experience(n_rollouts: int, mode: RolloutMode, ratio: float, rng: random.Random) -> list[bool]:
    """Whether each of a group's ``n_rollouts`` rollouts gets experience (see the module docstring)."""
    count = {"woexp": 0, "all": n_rollouts}.get(mode, min(n_rollouts, round(n_rollouts * ratio)))
    flags = [True] * count + [False] * (n_rollouts - count)
    rng.shuffle(flags)
    return flags


@dataclass(frozen=True)
class ExperiencePlan:
    """Per row of a rollout batch: retrieve experience for it, and what training does with that experience."""

    add_experience: list[bool]
    train_mode: list[TrainMode]

    @property
    def guided(self) -> int:
        """Rows that will get experience (if the memory has any for their task)."""
        return sum(self.add_experience)


def plan_rows(
    uids: Sequence[str],
    *,
    rollout_mode: RolloutMode,
    rollout_ratio: float,
    sample_mode: SampleMode,
    keep_ratio: float,
    rng: random.Random,
) -> ExperiencePlan:
    """The plan of a batch whose rows are grouped by ``uids`` (a task's rollouts share its uid; verl repeats
    each task's row ``n`` times). Groups are taken in order of first appearance, so the draw does not depend
    on how rows are interleaved."""
    groups: dict[str, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(str(uid), []).append(row)
    modes = allocate_train_modes(len(groups), sample_mode, keep_ratio, rng)
    add = [False] * len(uids)
    train: list[TrainMode] = ["keep"] * len(uids)
    for (_, rows), mode in zip(groups.items(), modes, strict=True):
        for row, flag in zip(rows, allocate_add_experience(len(rows), rollout_mode, rollout_ratio, rng), strict=True):
            add[row] = flag
            train[row] = mode
    return ExperiencePlan(add_experience=add, train_mode=train)
