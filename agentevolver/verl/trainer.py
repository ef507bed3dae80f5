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
  so the dumps carry the labels (``step_flags``) and the advantages that were trained on;
* Self-Navigating (``exp_manager`` / ``memory``): ``init_workers`` wraps verl's rollout manager so every
  batch gets the experience plan (:class:`~agentevolver.module.exp_manager.rollout.ExperienceRolloutManager`)
  and, before the first batch, the initial memory is built (``init_exp_before_training``);
  ``_update_actor`` turns each episode's ``exp_mask`` into the token mask the ``exp_on_off`` loss reads
  (plus ``exp_manager.off_cliprange_high`` in ``meta_info``) and afterwards submits the step's episodes for
  summarisation (every ``memory.updated_freq`` steps); ``fit`` stops after the initial memory when
  ``init_exp_only``.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentevolver.module.adv_processor import AdcaStage
from agentevolver.module.agent_flow.dump import RolloutDumpWriter
from agentevolver.module.exp_manager.manager import ExperienceManager
from agentevolver.module.exp_manager.rollout import ExperienceRolloutManager
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
    """RayPPOTrainer plus ADCA advantages, Self-Navigating, rollout dumps and episode metrics (see the module
    docstring)."""

    _adca: AdcaStage | None = None
    _exp: ExperienceManager | None = None

    # ------------------------------------------------------------------ Self-Navigating
    def init_workers(self) -> None:
        super().init_workers()
        exp = ExperienceManager.from_config(self.config)
        if exp.active:
            exp.check_memory()
            self._exp = exp
            self.async_rollout_manager = ExperienceRolloutManager(
                self.async_rollout_manager, exp, before_first=self._initial_memory)

    def _initial_memory(self, rollout_manager: Any, validate: bool, step: int) -> None:
        """``init_exp_before_training`` on a fresh run: the first batch is validation at step 0 or training at
        step 1; a resumed run starts later and keeps the memory it has."""
        assert self._exp is not None
        fresh = step == 0 if validate else step <= 1
        if self._exp.exp.init_exp_before_training and fresh:
            self._exp.initial_summary(self, rollout_manager)

    def fit(self) -> None:
        finished = False
        try:
            if self._exp is not None and self._exp.exp.init_exp_only:
                self._build_memory_only()
            else:
                super().fit()
            finished = True
        finally:
            if self._exp is not None:
                self._exp.close(wait=finished)  # a failed or interrupted run does not wait on summaries

    def _build_memory_only(self) -> None:
        """``init_exp_only``: build the memory from the training tasks and stop (no update, no checkpoint)."""
        assert self._exp is not None and isinstance(self.async_rollout_manager, ExperienceRolloutManager)
        self.checkpoint_manager.update_weights(0)
        metrics = self._exp.initial_summary(self, self.async_rollout_manager.inner)
        if metrics["exp/summary_stored"] == 0 and metrics["exp/summary_failed"] > 0:
            raise RuntimeError(
                f"init_exp_only: every summary request to the memory service at {self._exp.memory.base_url} "
                "failed, so no memory was built; see the warnings above (is the service up, and its "
                "exp_summarizer LLM?)")
        logger.info("init_exp_only: memory %r built (%d experiences stored); not training, as configured",
                    self._exp.workspace_id, int(metrics["exp/summary_stored"]))

    @staticmethod
    def _exp_token_mask(batch: DataProto, off_cliprange_high: float) -> None:
        """Each episode's ``exp_mask`` (training context differs from generation context) as the per-token
        mask the ``exp_on_off`` loss reads, and its clip in ``meta_info`` (both travel to the actor)."""
        flags = batch.non_tensor_batch.pop("exp_mask", None)
        if flags is None:
            return
        response_mask = batch.batch["response_mask"]
        per_sample = torch.as_tensor(np.asarray(flags, dtype=np.float32), device=response_mask.device)
        batch.batch["exp_mask"] = per_sample[:, None] * response_mask.to(torch.float32)
        batch.meta_info["exp_off_cliprange_high"] = float(off_cliprange_high)

    # ------------------------------------------------------------------ the update
    def _update_actor(self, batch: DataProto) -> DataProto:
        if self._adca is None:
            self._adca = AdcaStage(self.config, self.total_training_steps)
        adca_metrics = self._adca.apply(batch, self.global_steps)
        dump = self.config.agent_flow.dump
        if dump.enable:
            path = RolloutDumpWriter(str(dump.dir)).write_records(
                self.global_steps, dump_records(batch, self.global_steps, bool(dump.include_messages)))
            logger.info("rollout dump of step %d: %s", self.global_steps, path)
        step_metrics = episode_metrics(batch.non_tensor_batch)
        self._exp_token_mask(batch, self.config.exp_manager.off_cliprange_high)
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update(step_metrics)
        output.meta_info["metrics"].update(adca_metrics)
        if self._exp is not None:
            output.meta_info["metrics"].update(self.async_rollout_manager.last_plan)
            output.meta_info["metrics"].update(self._exp.after_step(batch, self.global_steps))
        return output
