"""Stage ``dump``: ``rollouts/step_<N>.jsonl``, every episode of the step token by token with the advantages it
is trained on (docs/rollout_dumps.md). It runs after the advantage stage and before the update and the
checkpoint, so a crash there never loses a step's episodes. A full disk or another write error loses the
dump, not the run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agentevolver.module.agent_flow.dump import RolloutDumpWriter

if TYPE_CHECKING:
    from verl import DataProto

    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["dump_records", "write_dump", "write_step_dump"]

logger = logging.getLogger(__name__)


def write_dump(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``dump``: the episodes' records to ``agent_flow.dump.dir`` when ``agent_flow.dump.enable``; a write
    error is a warning naming the file and what it would have held, and ``dump/lost_episodes`` counts them."""
    if not trainer.settings.agent_flow.dump.enable:
        return state
    path = write_step_dump(state, trainer)
    state.metrics["dump/lost_episodes"] = 0.0 if path else float(len(state.episodes))
    return state


def write_step_dump(state: StepState, trainer: AgentEvolverTrainer) -> str | None:
    """Write the step's episodes (with their advantages once the ``adv`` stage computed them) and return the
    file; None when the dump is off or could not be written (a warning says why)."""
    dump = trainer.settings.agent_flow.dump
    if not dump.enable:
        return None
    records = dump_records(state.episodes, state.step, bool(dump.include_messages))
    try:
        path = RolloutDumpWriter(str(dump.dir)).write_records(state.step, records)
    except OSError as err:
        logger.warning("rollout dump of step %d NOT written to %s (%s): its %d episodes are lost from the dump; "
                       "training goes on (free space there, or move agent_flow.dump.dir)", state.step, dump.dir,
                       err.strerror or err, len(records))
        return None
    logger.info("rollout dump of step %d: %s", state.step, path)
    return str(path)


def dump_records(batch: DataProto, step: int, include_messages: bool = True) -> list[dict[str, Any]]:
    """The dump record of every episode in ``batch``, with its token advantages when the batch has them."""
    records = []
    episodes = batch.non_tensor_batch.get("episode_record")
    if episodes is None:
        return records
    advantages = batch.batch.get("advantages", None)
    step_flags = batch.non_tensor_batch.get("step_flags")
    staleness = batch.non_tensor_batch.get("staleness")  # async training only
    for index, episode in enumerate(episodes):
        record = dict(episode)
        record["step"] = step
        if staleness is not None:
            record["staleness"] = int(staleness[index])
        if advantages is not None:
            record["advantages"] = advantages[index, : len(record["response_ids"])].tolist()
        if step_flags is not None and step_flags[index] is not None:
            record["step_flags"] = [bool(flag) for flag in step_flags[index]]
        if not include_messages:
            record.pop("messages", None)
        records.append(record)
    return records
