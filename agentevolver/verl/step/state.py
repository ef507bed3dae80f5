"""The stage contract: what one training step holds, and how a stage takes it and hands it on.

Every stage of the step is a function ``stage(state, trainer) -> state`` (:data:`StageFn`), one concept per
module under :mod:`agentevolver.verl.step`, named in :data:`agentevolver.verl.step.trainer.STEP` and timed
there as ``timing_s/<name>``. The shape is verl v1's ``batch = self._compute_x(batch, metrics=metrics)``, with
the batch and the metrics in one object, so a stage returns nothing but the state and reads nothing but the
state and the trainer (its workers, config and validated settings).

:class:`StepState` owns the step's rows and the two views of them that used to be kept in sync by hand:

- ``batch``: every row the update trains on (episodes first, then their earlier samples and padding);
- ``episodes``: the first ``episode_count`` rows, one per episode, where advantages are computed (each episode
  counts once in its group) and which the dump, the metrics and the memory read. It is derived from ``batch``
  when first asked for and again after ``batch`` is replaced; the advantage stage sets it to the rows it
  computed the advantages on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentevolver.verl.step.sample_rows import episode_rows

if TYPE_CHECKING:
    from verl import DataProto

    from agentevolver.module.adv_processor import StepLabels
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["Stage", "StageFn", "StepState", "run_stages"]


@dataclass
class StepState:
    """One training step's data as it passes from stage to stage (module docstring)."""

    #: verl's 1-based ``global_steps`` of this step, and its epoch.
    step: int
    epoch: int
    #: The dataloader's collated task rows (the ``tasks`` stage's input).
    task_rows: dict[str, Any]
    #: The rows the rollout gets (``tasks`` builds them, ``experience_plan`` plans them, ``gen`` consumes them).
    inputs: DataProto | None = None
    #: Rows whose first ``episode_count`` are the episodes (0 until ``sample_rows`` adds rows of its own).
    episode_count: int = 0
    #: The judge's step labels for the advantage stage (None when ADCA is off or not labelling this step).
    labels: StepLabels | None = None
    #: The step's metrics, filled by the stages and returned by ``train_step``.
    metrics: dict[str, float] = field(default_factory=dict)
    #: Seconds per stage (``timing_s/<stage>``), plus the rollout's own split (verl's ``agent_loop/*``).
    timings: dict[str, float] = field(default_factory=dict)
    #: ``time.perf_counter()`` when the step began (``timing_s/step`` is measured from here; in async training,
    #: from the end of the step before, so it is the loop's time per step).
    started: float = field(default_factory=time.perf_counter)
    #: Async training (:mod:`agentevolver.verl.async_loop`): the step whose weights the rollout servers held
    #: when this step's episodes were generated, and the data loader's position right after its tasks (what a
    #: checkpoint at this step saves). None in the synchronous loop.
    rollout_version: int | None = None
    loader_state: dict[str, Any] | None = None
    _batch: DataProto | None = field(default=None, repr=False)
    _episodes: DataProto | None = field(default=None, repr=False)

    @property
    def batch(self) -> DataProto:
        """Every row of the step; set by ``tasks``, replaced by the stages that add or join rows."""
        if self._batch is None:
            raise RuntimeError("the step has no rows yet: the `tasks` stage builds them")
        return self._batch

    @batch.setter
    def batch(self, rows: DataProto) -> None:
        self._batch = rows
        self._episodes = None  # derived again from the new rows when next asked for

    @property
    def episodes(self) -> DataProto:
        """The episode rows (one per episode): ``batch`` itself when it holds no other rows."""
        if self._episodes is None:
            count = self.episode_count or len(self.batch)
            self._episodes = episode_rows(self.batch, count)
        return self._episodes

    @episodes.setter
    def episodes(self, rows: DataProto) -> None:
        self._episodes = rows


#: A stage: takes the step's state and returns it (module docstring).
StageFn = Callable[[StepState, "AgentEvolverTrainer"], StepState]


@dataclass(frozen=True)
class Stage:
    """A named stage of the step; ``name`` is its timer (``timing_s/<name>``; verl's name where verl has one)."""

    name: str
    run: StageFn


def run_stages(stages: Sequence[Stage], state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Run ``stages`` in order on ``state``, timing each; a stage that raises stops the step (its timings so far
    stay in ``state.timings``)."""
    for stage in stages:
        began = time.perf_counter()
        try:
            state = stage.run(state, trainer)
        finally:
            state.timings[stage.name] = state.timings.get(stage.name, 0.0) + time.perf_counter() - began
    return state
