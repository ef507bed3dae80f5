"""Asynchronous training (``trainer.mode=async``): the next steps' episodes run while this step trains.

In the synchronous loop a step is rollout, then update: the rollout servers idle while the actor trains, and
the actor idles while episodes wait on tools. Here a producer thread runs the step's rollout stages (``tasks``
to ``seat_rows``, :data:`~agentevolver.verl.step.trainer.ROLLOUT_STAGES`) for later steps while the main
thread runs the training stages of the current one, so a step costs about max(rollout, update) instead of
their sum. Nothing else changes: the stages, the experience plan, faults, dumps, ADCA and the memory summary
are the synchronous ones, run on the same :class:`~agentevolver.verl.step.state.StepState`.

**The staleness bound.** The rollout servers hold weights of version ``v`` (the step whose update they came
from; the initial or resumed weights are version ``global_steps`` at start). Step ``s`` trains the actor of
version ``s - 1``, so episodes generated on version ``v`` are ``s - 1 - v`` updates stale. The producer starts
step ``s``'s rollout only when the servers hold a version ``>= s - 1 - max_staleness``; ``max_staleness = 0``
would be the synchronous loop, ``1`` lets the next step's rollout overlap this step's update. Each episode row
carries its ``staleness`` (in the rollout dump too), and every step logs ``async/staleness_mean``,
``async/staleness_max``, ``async/off_policy_share`` (the share of the step's episodes with staleness > 0) and
``async/wait_rollout_s`` (how long the trainer waited for the rollout: for the step's episodes, and for the
rollout in flight before the weight sync). A step whose staleness exceeds the bound
is a bug, and stops the run.

**The pause.** The weight sync and validation (the ``update_weights`` and ``testing`` stages) need the rollout
servers to themselves: the main thread asks for a pause, waits for the rollout in flight to finish, syncs,
validates, and lets the producer go on. The producer never starts a rollout while a pause is asked for.

**Checkpoints.** A checkpoint at step ``s`` saves the data loader's position right after step ``s``'s tasks
(not the producer's, which has drawn later steps), so a resume draws the tasks of the buffered steps again:
their episodes are dropped and played again on the resumed weights, and no task is skipped. The log says
which steps were dropped.

**Threads and Ray.** Both threads call Ray: the producer the agent-loop workers and the rollout servers, the
main thread the actor worker group. They are separate actors, so the calls run at the same time.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from omegaconf import OmegaConf

from agentevolver.errors import ConfigError

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState

__all__ = ["MODES", "RolloutAhead", "TaskBatch", "async_settings", "check_async", "record_staleness"]

logger = logging.getLogger(__name__)

#: ``trainer.mode`` values.
MODES = ("sync", "async")


def async_settings(cfg: Any) -> int | None:
    """The staleness bound of an async run (``trainer.max_staleness``), or None for the synchronous loop."""
    mode = str(OmegaConf.select(cfg, "trainer.mode", default="sync"))
    if mode != "async":
        return None
    return int(OmegaConf.select(cfg, "trainer.max_staleness", default=1))


def check_async(cfg: Any) -> None:
    """Refuse, naming the key and the fix, an async setting that cannot run (driver side, before Ray starts).

    Raises:
        ConfigError: a mode other than sync/async, a staleness bound below 1, or a GPU rollout that frees its
            memory for the update (``free_cache_engine``), which leaves nothing to overlap.
    """
    mode = OmegaConf.select(cfg, "trainer.mode", default="sync")
    if mode not in MODES:
        raise ConfigError(f"trainer.mode must be one of {', '.join(MODES)}; got {mode!r}")
    if mode != "async":
        return
    bound = OmegaConf.select(cfg, "trainer.max_staleness", default=1)
    if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
        raise ConfigError(f"trainer.max_staleness must be an integer >= 1 with trainer.mode=async (1: the next "
                          f"step's episodes run during this step's update); got {bound!r}. For no staleness use "
                          "trainer.mode=sync")
    rollout = OmegaConf.select(cfg, "actor_rollout_ref.rollout", default={}) or {}
    if str(rollout.get("name", "")) != "hf" and bool(rollout.get("free_cache_engine", True)):
        raise ConfigError(
            f"trainer.mode=async overlaps the rollout with the update, but the {rollout.get('name')!r} rollout "
            "servers give their GPU memory back for every update (actor_rollout_ref.rollout.free_cache_engine="
            "true), so they could not generate meanwhile: set actor_rollout_ref.rollout.free_cache_engine=false "
            "and a rollout.gpu_memory_utilization that leaves the update room beside it (docs/backends.md, "
            "'Async'), or trainer.mode=sync")


@dataclass
class TaskBatch:
    """A step's task rows as the data loader gave them, with the loader's position right after them."""

    step: int
    epoch: int
    rows: dict[str, Any]
    loader_state: dict[str, Any] | None


def record_staleness(state: StepState, bound: int) -> None:
    """Each episode row's staleness (``staleness`` column, also in the dump) and the step's ``async/*`` metrics.

    Raises:
        RuntimeError: the episodes are staler than ``bound`` (the producer's wait is wrong).
    """
    version = state.rollout_version
    assert version is not None, "the producer records the weights version of every step it rolls out"
    staleness = state.step - 1 - version
    if staleness > bound or staleness < 0:
        raise RuntimeError(f"step {state.step}'s episodes ran on the weights of step {version}: staleness "
                           f"{staleness}, outside 0..{bound} (trainer.max_staleness); this is a bug in the async loop")
    rows = len(state.batch)
    state.batch.non_tensor_batch["staleness"] = np.full(rows, staleness, dtype=object)
    state.metrics.update({
        "async/staleness_mean": float(staleness),
        "async/staleness_max": float(staleness),
        "async/off_policy_share": 1.0 if staleness > 0 else 0.0,
        "async/max_staleness": float(bound),
    })


class RolloutAhead:
    """The producer thread: rolls out the steps in order, at most ``bound`` updates ahead of the trainer.

    Args:
        batches: the steps' task rows, in order (drawn in the producer thread, under :attr:`loader_lock`).
        roll_out: runs a step's rollout stages on a fresh state and returns it.
        new_state: builds the step's :class:`StepState` from its :class:`TaskBatch`.
        version: the version of the weights the rollout servers hold now (the step they came from).
        bound: ``trainer.max_staleness``.
    """

    def __init__(self, batches: Iterator[TaskBatch], roll_out: Callable[[StepState], StepState],
                 new_state: Callable[[TaskBatch], StepState], *, version: int, bound: int) -> None:
        self._batches = batches
        self._roll_out = roll_out
        self._new_state = new_state
        self.bound = bound
        #: Held while the producer draws from the data loader; a checkpoint holds it to read the loader.
        self.loader_lock = threading.Lock()
        self._cond = threading.Condition()
        self._version = version
        self._busy = False  # a rollout is in flight
        self._in_flight: int | None = None  # its step
        self._pause_wanted = False
        self._stopped = False
        self._ready: queue.Queue[tuple[StepState | None, BaseException | None]] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rollout-ahead", daemon=True)

    def start(self) -> RolloutAhead:
        self._thread.start()
        return self

    @property
    def version(self) -> int:
        """The version of the weights the rollout servers hold."""
        return self._version

    # ------------------------------------------------------------------ producer side
    def _run(self) -> None:
        try:
            while True:
                with self.loader_lock:
                    task_batch = next(self._batches, None)
                if task_batch is None:
                    break
                oldest = task_batch.step - 1 - self.bound  # the oldest weights this step may roll out on
                with self._cond:
                    self._cond.wait_for(partial(self._may_start, oldest))
                    if self._stopped:
                        return
                    self._busy, self._in_flight = True, task_batch.step
                    version = self._version
                try:
                    state = self._new_state(task_batch)
                    state.rollout_version = version
                    state.loader_state = task_batch.loader_state
                    state = self._roll_out(state)
                finally:
                    with self._cond:
                        self._busy, self._in_flight = False, None
                        self._cond.notify_all()
                self._ready.put((state, None))
        except BaseException as err:
            self._ready.put((None, err))

    def _may_start(self, oldest: int) -> bool:
        """A rollout may start: no pause is asked for and the servers' weights are at least ``oldest``
        (or the loop is stopping, which the caller checks)."""
        return self._stopped or (not self._pause_wanted and self._version >= oldest)

    # ------------------------------------------------------------------ trainer side
    def next_step(self) -> tuple[StepState, float]:
        """The next step's rolled-out state (in step order) and the seconds spent waiting for it.

        Raises:
            whatever the producer raised while rolling it out; RuntimeError if it ran out of task batches.
        """
        began = time.perf_counter()
        while True:
            try:
                state, error = self._ready.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._ready.empty():
                    raise RuntimeError("the rollout-ahead thread ended without a step for the trainer") from None
        if error is not None:
            raise error
        assert state is not None
        return state, time.perf_counter() - began

    @contextmanager
    def paused(self) -> Iterator[float]:
        """The rollout servers to the caller alone: waits for the rollout in flight (yields the seconds waited);
        none starts until exit."""
        began = time.perf_counter()
        with self._cond:
            self._pause_wanted = True
            self._cond.wait_for(lambda: not self._busy)
        try:
            yield time.perf_counter() - began
        finally:
            with self._cond:
                self._pause_wanted = False
                self._cond.notify_all()

    def weights_synced(self, version: int) -> None:
        """The rollout servers now hold the weights of step ``version`` (called inside :meth:`paused`)."""
        with self._cond:
            self._version = version
            self._cond.notify_all()

    def buffered_steps(self, after: int) -> list[int]:
        """Steps after ``after`` already rolled out or in flight (what a checkpoint now would drop)."""
        with self._cond:
            waiting = [state.step for state, _ in list(self._ready.queue) if state is not None]
            in_flight = [self._in_flight] if self._in_flight is not None else []
        return sorted(step for step in waiting + in_flight if step > after)

    def stop(self) -> None:
        """Stop after the rollout in flight (the thread is a daemon: a failed run does not wait for it)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
