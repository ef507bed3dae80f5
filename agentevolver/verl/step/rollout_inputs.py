"""The step's first stage, ``tasks``: a batch of task rows -> the rows the rollout gets; and the initial rollouts
of Self-Navigating's memory build.

verl's agent-loop manager takes every non-tensor column of a task row (the task, the raw prompt, tools) and
the columns its reward needs (``data_source``, ``reward_model``, ``extra_info``, ``uid``), repeated
``rollout.n`` times per task (``interleave``: a task's episodes are adjacent). The trainer keeps the reward
columns on its side and joins the episodes back onto them after the rollout.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["REWARD_COLUMNS", "initial_rollouts", "rollout_inputs", "task_batch", "task_rows"]

logger = logging.getLogger(__name__)

#: Columns both sides keep: the rollout's reward needs them, and the trainer joins the episodes on them.
REWARD_COLUMNS = frozenset({"data_source", "reward_model", "extra_info", "uid"})


def task_batch(rows: dict[str, Any]) -> Any:
    """The dataloader's collated rows as a verl ``DataProto``, each task with a fresh GRPO group id (``uid``)."""
    from verl import DataProto

    batch = DataProto.from_single_dict(rows)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    return batch


def rollout_inputs(batch: Any) -> Any:
    """Split ``batch``: the returned rows carry every non-tensor column (for the agent loop); ``batch`` keeps
    its tensors and the reward columns (:data:`REWARD_COLUMNS`), which both sides then hold."""
    keys = set(batch.non_tensor_batch)
    inputs = batch.pop(batch_keys=[], non_tensor_batch_keys=sorted(keys - REWARD_COLUMNS))
    inputs.non_tensor_batch.update(batch.non_tensor_batch)
    return inputs


def task_rows(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``tasks``: the step's task rows as a batch (a fresh GRPO group id per task), and the rollout's rows,
    each task repeated ``rollout.n`` times. Both carry the rollout temperature, which the log-prob passes read."""
    rollout = trainer.config.actor_rollout_ref.rollout
    batch = task_batch(state.task_rows)
    batch.meta_info["temperature"] = rollout.temperature
    inputs = rollout_inputs(batch)
    inputs.meta_info.update(global_steps=state.step, temperature=rollout.temperature)
    state.inputs = inputs.repeat(repeat_times=int(rollout.n), interleave=True)
    state.batch = batch
    return state


def initial_rollouts(trainer: Any, limit: int | None) -> Iterator[Any]:
    """The training tasks (at most ``limit``) rolled out once, ``rollout.n`` episodes each, without experience:
    one verl ``DataProto`` per ``data.train_batch_size`` tasks, for Self-Navigating's initial memory
    (:meth:`ExperienceManager.initial_summary`). Batches are padded to the agent-loop worker count like
    verl's validation batches."""
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
        batch = task_batch(collate_fn([dataset[i] for i in range(begin, min(begin + batch_size, count))]))
        inputs = rollout_inputs(batch)
        inputs.meta_info["global_steps"] = 0
        inputs = inputs.repeat(repeat_times=n, interleave=True)
        padded, pad = pad_dataproto_to_divisor(inputs, divisor)
        yield unpad_dataproto(trainer.async_rollout_manager.generate_sequences(padded), pad_size=pad)
        logger.info("Self-Navigating: initial rollouts %d/%d tasks", min(begin + batch_size, count), count)
