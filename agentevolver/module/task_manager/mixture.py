"""Mixture strategies: which tasks the trainer sees, by name (``task_manager.mixture.strategy``).

* ``unified`` (training): the original tasks (``use_original_tasks``) plus ``round(synthetic_data_ratio x
  number of original tasks)`` synthetic tasks drawn with ``seed`` (all of them if fewer were generated),
  shuffled with ``seed`` when ``shuffle`` is on.
* ``original_only`` (validation, always): the original tasks only, so evaluation is never polluted by
  synthetic tasks (seed 000, chapter 1: the val TaskManager uses OriginalOnlyStrategy).
"""

from __future__ import annotations

import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from agentevolver.config.schema import MixtureSection
from agentevolver.registry import Registry
from agentevolver.schema import TaskObjective

__all__ = ["MIXTURES", "MixtureStrategy", "OriginalOnlyMixture", "UnifiedMixture"]

logger = logging.getLogger(__name__)

#: Mixture strategies by name (``task_manager.mixture.strategy``).
MIXTURES: Registry[Callable[..., MixtureStrategy]] = Registry("mixture strategy", "task_manager.mixture.strategy")


class MixtureStrategy(ABC):
    """Builds a task list from the original tasks and the synthetic pool; built from the mixture section."""

    def __init__(self, section: MixtureSection) -> None:
        self.section = section

    @abstractmethod
    def mix(self, original: Sequence[TaskObjective], synthetic: Sequence[TaskObjective]) -> list[TaskObjective]:
        """The tasks, in the order the dataset will hold them."""


@MIXTURES.register("unified")
class UnifiedMixture(MixtureStrategy):
    """Original tasks on/off, a synthetic ratio, a seeded shuffle (see the module docstring)."""

    def mix(self, original: Sequence[TaskObjective], synthetic: Sequence[TaskObjective]) -> list[TaskObjective]:
        section = self.section
        rng = random.Random(section.seed)
        wanted = round(section.synthetic_data_ratio * len(original))
        if wanted > len(synthetic):
            logger.warning("mixture: synthetic_data_ratio %.3g asks for %d synthetic tasks, %d were generated; "
                           "using all of them", section.synthetic_data_ratio, wanted, len(synthetic))
        drawn = rng.sample(list(synthetic), k=min(wanted, len(synthetic)))
        tasks = [*(original if section.use_original_tasks else []), *drawn]
        if section.shuffle:
            rng.shuffle(tasks)
        return tasks


@MIXTURES.register("original_only")
class OriginalOnlyMixture(MixtureStrategy):
    """The original tasks only, in their order."""

    def mix(self, original: Sequence[TaskObjective], synthetic: Sequence[TaskObjective]) -> list[TaskObjective]:
        return list(original)
