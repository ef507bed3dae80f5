"""verl's ``RayPPOTrainer`` with this project's stages hooked in through its overridable methods.

We build on verl's legacy trainer (``trainer.use_v1=false``): its step is a sequence of methods
(``_update_actor``, ``_log_rollout_data``, ``_compute_old_log_prob``, ...) that a subclass can extend
without copying the loop, and it needs no TransferQueue service. The stages added here:

* rollout dumps: ``_update_actor`` writes ``rollouts/step_<N>.jsonl`` (``agent_flow.dump.dir``) in our
  format, with each episode's token advantages, *before* the update and the checkpoint, so a crash after
  the checkpoint never loses a step's episodes (verl's own ``_log_rollout_data`` runs after both);
* episode metrics: ``_update_actor`` adds success rate, how episodes ended, env/parse errors and the
  generate/env time split to the step's metrics (verl logs what that method returns);
* Self-Attributing (``attribution_driven_credit_assignment.enable``): ``_update_actor`` first lets
  :class:`~agentevolver.module.adv_processor.AdcaStage` label each episode's steps with the judge LLM and
  replace verl's GRPO advantages by ADCA-GRPO's (after rewards and GRPO, before the dump and the update),
  so the dumps carry the labels (``step_flags``) and the advantages that were trained on.
"""

from __future__ import annotations

import logging
from typing import Any

from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentevolver.module.adv_processor import AdcaStage
from agentevolver.module.agent_flow.dump import RolloutDumpWriter
from agentevolver.module.trainer.episode_metrics import episode_metrics

__all__ = ["AgentEvolverTrainer", "dump_records"]

logger = logging.getLogger(__name__)


def dump_records(batch: DataProto, step: int, include_messages: bool = True) -> list[dict[str, Any]]:
    """The dump record of every episode in ``batch``, with its token advantages when the batch has them."""
    records = []
    episodes = batch.non_tensor_batch.get("episode_record")
    if episodes is None:
        return records
    advantages = batch.batch.get("advantages", None)
    step_flags = batch.non_tensor_batch.get("step_flags")
    for index, episode in enumerate(episodes):
        record = dict(episode)
        record["step"] = step
        if advantages is not None:
            record["advantages"] = advantages[index, : len(record["response_ids"])].tolist()
        if step_flags is not None and step_flags[index] is not None:
            record["step_flags"] = [bool(flag) for flag in step_flags[index]]
        if not include_messages:
            record.pop("messages", None)
        records.append(record)
    return records


class AgentEvolverTrainer(RayPPOTrainer):
    """RayPPOTrainer plus ADCA advantages, rollout dumps and episode metrics (see the module docstring)."""

    _adca: AdcaStage | None = None

    def _update_actor(self, batch: DataProto) -> DataProto:
        if self._adca is None:
            self._adca = AdcaStage(self.config, self.total_training_steps)
        adca_metrics = self._adca.apply(batch, self.global_steps)
        dump = self.config.agent_flow.dump
        if dump.enable:
            path = RolloutDumpWriter(str(dump.dir)).write_records(
                self.global_steps, dump_records(batch, self.global_steps, bool(dump.include_messages)))
            logger.info("rollout dump of step %d: %s", self.global_steps, path)
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(episode_metrics(batch.non_tensor_batch))
        output.meta_info["metrics"].update(adca_metrics)
        return output
