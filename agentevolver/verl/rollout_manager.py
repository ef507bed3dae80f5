"""verl's agent-loop manager with this project's two rollout-time stages around every batch it rolls out.

verl's trainer repeats each task's row ``rollout.n`` times and hands the batch straight to
``async_rollout_manager.generate_sequences`` (training and validation alike); that call is the one place
where a step's rows exist with their group ids before any episode starts, and where its episodes exist
before verl spends anything on them. So two stages sit there:

- before: Self-Navigating's experience plan (per-row keep/discard and add-experience columns; the first call
  builds the initial memory), when an experience manager is active;
- after (training batches): the failed-episode check (:func:`agentevolver.verl.faults.check_failed_share`):
  a step in which every episode, or more than ``agent_flow.max_failed_share`` of them, failed stops the run
  here with a message naming the service, before verl's own checks meet a batch with no token to train.

The wrapper forwards everything else to verl's manager unchanged, so no verl code is copied or patched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from agentevolver.module.exp_manager.manager import ExperienceManager
from agentevolver.verl.faults import check_failed_share

__all__ = ["StepRolloutManager", "initial_rollouts"]

logger = logging.getLogger(__name__)


class StepRolloutManager:
    """Wraps verl's ``AgentLoopManager`` (module docstring); ``before_first`` runs once, before the first batch
    (the initial memory build needs the rollout servers, which exist only once workers are up)."""

    def __init__(self, inner: Any, manager: ExperienceManager | None, *, max_failed_share: float,
                 before_first: Callable[[Any, bool, int], None] | None = None) -> None:
        self.inner = inner
        self.manager = manager
        self.max_failed_share = max_failed_share
        self._before_first = before_first if manager is not None else None
        #: ``exp/*`` numbers of the last training batch's plan (merged into that step's metrics).
        self.last_plan: dict[str, float] = {}

    def generate_sequences(self, batch: Any) -> Any:
        validate = bool(batch.meta_info.get("validate", False))
        step = int(batch.meta_info.get("global_steps", 0))
        if self.manager is not None:
            if self._before_first is not None:
                first, self._before_first = self._before_first, None
                first(self.inner, validate, step)
            plan = self.manager.plan(batch, validate=validate, step=step)
            if not validate:
                self.last_plan = plan
        output = self.inner.generate_sequences(batch)
        if not validate:
            check_failed_share(output.non_tensor_batch, self.max_failed_share, step)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def initial_rollouts(trainer: Any, rollout_manager: Any, limit: int | None) -> Iterator[Any]:
    """The training tasks (at most ``limit``) rolled out once, ``rollout.n`` episodes each, without experience:
    one verl ``DataProto`` per ``data.train_batch_size`` tasks, for Self-Navigating's initial memory
    (:meth:`ExperienceManager.initial_summary`). Batches are padded to the agent-loop worker count like the
    trainer's validation batches."""
    import uuid

    import numpy as np
    from verl import DataProto
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
    from verl.utils.dataset.rl_dataset import collate_fn

    config = trainer.config
    dataset = trainer.train_dataset
    count = len(dataset) if limit is None else min(limit, len(dataset))
    batch_size = int(config.data.train_batch_size)
    n = int(config.actor_rollout_ref.rollout.n)
    divisor = int(config.actor_rollout_ref.rollout.agent.num_workers)
    logger.info("Self-Navigating: building the memory from %d training tasks x %d episodes", count, n)
    for begin in range(0, count, batch_size):
        rows = [dataset[i] for i in range(begin, min(begin + batch_size, count))]
        batch = DataProto.from_single_dict(collate_fn(rows))
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in rows], dtype=object)
        gen = trainer._get_gen_batch(batch)
        gen.meta_info["global_steps"] = 0
        gen = gen.repeat(repeat_times=n, interleave=True)
        padded, pad = pad_dataproto_to_divisor(gen, divisor)
        yield unpad_dataproto(rollout_manager.generate_sequences(padded), pad_size=pad)
        logger.info("Self-Navigating: initial rollouts %d/%d tasks", min(begin + batch_size, count), count)
