"""verl's ``RayPPOTrainer`` with this project's stages, each a named call with its own timer.

We build on verl's legacy trainer (``trainer.use_v1=false``): its ``fit`` runs the step as a sequence of
overridable methods, so a subclass adds stages without copying the loop, and it needs no TransferQueue
service. **One training step**, in order (``*`` = ours; verl's timers are ``timing_s/gen``, ``reward``,
``old_log_prob``, ``ref``, ``adv``, ``update_actor``, ...; ours are ``timing_s/<stage>``):

1. tasks: a batch of rows from :class:`~agentevolver.verl.task_dataset.TaskDataset` (the task manager's mixture)
2. ``*`` experience plan (Self-Navigating): :class:`~agentevolver.verl.rollout_manager.StepRolloutManager`
   writes per-row keep/discard and add-experience columns; the first call builds the initial memory
3. rollout: verl's agent-loop manager runs ``rollout.n`` episodes per task (:mod:`agentevolver.verl.agent_loop`);
   the episode's reward is its score (env ``/evaluate`` or the task's grader); ``*`` then a step in which too
   many episodes failed stops the run, naming the service (:func:`agentevolver.verl.faults.check_failed_share`)
4. old / reference log-probs (verl; the rollout's in bypass mode), advantages (verl's ``compute_advantage``)
5. ``*`` ``faults``: episodes whose environment, rollout server or grader failed are kept out of the update
   (no loss on their tokens, no say in a group's baseline: advantages computed again without them;
   :mod:`agentevolver.verl.faults`)
6. ``*`` ``adca_judge`` (Self-Attributing): the judge labels steps, ADCA-GRPO advantages replace GRPO's
7. ``*`` ``dump``: ``rollouts/step_<N>.jsonl`` with the advantages trained on (before the update and the
   checkpoint, so a crash never loses a step's episodes)
8. ``*`` ``episode_metrics``: success, how episodes ended, env/parse errors, generate/env time
9. ``*`` ``sample_rows``: earlier samples of multi-sample episodes become rows with the episode's advantage
   (:mod:`agentevolver.verl.sample_rows`), padded to whole mini-batches
10. ``*`` ``exp_mask`` (Self-Navigating): per-token off-policy mask + clip for the ``exp_on_off`` loss
11. ``*`` ``actor_update``: verl's actor update (the loss that reads ``exp_mask`` was given to the actor
    through ``set_loss_fn`` in :meth:`AgentEvolverTrainer.init_workers`)
12. ``*`` ``memory_summary`` (Self-Navigating): every ``memory.updated_freq`` steps the episodes are summarised
    into the memory service in the background
13. checkpoint, weights to the rollout servers, validation, logging (verl)

Stages 5-12 run inside verl's ``update_actor`` timer, so ``timing_s/update_actor`` is their sum;
``timing_s/actor_update`` is the update alone. The stage objects are built in ``__init__`` (a bad ADCA or
memory config fails before any worker or rollout server starts) and closed in ``fit``'s ``finally``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentevolver.config import validate_config
from agentevolver.errors import ConfigError
from agentevolver.finished_run import already_trained_message
from agentevolver.module.adv_processor import AdcaStage
from agentevolver.module.agent_flow.dump import RolloutDumpWriter
from agentevolver.module.exp_manager.manager import ExperienceManager
from agentevolver.verl.episode_metrics import episode_metrics
from agentevolver.verl.faults import exclude_failed, failure_metrics
from agentevolver.verl.rollout_manager import StepRolloutManager, initial_rollouts
from agentevolver.verl.sample_rows import expand_sample_rows, minibatch_rows, refusal
from agentevolver.verl.shared_prefix.checks import check_shared_prompts

#: ``meta_info`` key that turns the engines' shared-prompt forward on for a pass (verl's actor config key name).
SHARED_PROMPTS = "use_prefix_grouper"

__all__ = ["SHARED_PROMPTS", "AgentEvolverTrainer", "check_stages", "dump_records", "exp_token_mask"]

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
    """RayPPOTrainer plus this project's stages (see the module docstring for the step in order)."""

    #: Our stages of the update, in the order they run (each timed as ``timing_s/<name>``).
    STAGES = ("faults", "adca_judge", "dump", "episode_metrics", "sample_rows", "exp_mask", "actor_update", "memory_summary")

    def __init__(self, *args: Any, settings: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = settings if settings is not None else validate_config(self.config)
        check_stages(self.config, self.settings, use_critic=bool(self.use_critic))
        self._adca = AdcaStage(self.config, self.total_training_steps, settings=self.settings)
        exp = ExperienceManager.from_config(self.config, self.settings)
        self._exp: ExperienceManager | None = exp if exp.active else None
        self._timings: dict[str, float] = {}

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timings[f"timing_s/{name}"] = time.perf_counter() - started

    # ------------------------------------------------------------------ start-up
    def init_workers(self) -> None:
        super().init_workers()
        self._give_actor_exp_loss()
        if self._exp is not None:
            self._exp.check_memory()
        self.async_rollout_manager = StepRolloutManager(
            self.async_rollout_manager, self._exp, before_first=self._initial_memory,
            max_failed_share=float(self.config.agent_flow.max_failed_share))

    def _give_actor_exp_loss(self) -> None:
        """The actor's loss through verl's ``set_loss_fn``: verl's ``ppo_loss`` that also shows a registered
        policy loss the batch's ``exp_mask`` (equal to verl's own when the batch has none)."""
        from verl.utils.config import omega_conf_to_dataclass

        from agentevolver.verl.exp_loss import exp_aware_ppo_loss

        if (self.config.get("distillation") or {}).get("enabled", False):
            return  # verl's distillation loss stays (it does not see exp_mask: exp_on_off acts as vanilla there)
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(exp_aware_ppo_loss, actor_config))

    def _initial_memory(self, rollout_manager: Any, validate: bool, step: int) -> None:
        """``init_exp_before_training`` on a fresh run: the first batch is validation at step 0 or training at
        step 1; a resumed run starts later and keeps the memory it has."""
        assert self._exp is not None
        fresh = step == 0 if validate else step <= 1
        if self._exp.exp.init_exp_before_training and fresh:
            self._exp.initial_summary(
                initial_rollouts(self, rollout_manager, self._exp.exp.init_exp_max_tasks))

    def _load_checkpoint(self) -> Any:
        """verl's resume, then a stop when the checkpoint is already the last step: verl would otherwise
        train one step past ``total_training_steps`` (:mod:`agentevolver.finished_run`; the driver asks first
        where the step count is configured, this covers counts that come from the dataset)."""
        loaded = super()._load_checkpoint()
        if self.global_steps >= self.total_training_steps > 0:
            raise _AlreadyTrained(already_trained_message(
                self.global_steps, self.total_training_steps, str(self.config.trainer.default_local_dir),
                str(self.config.trainer.experiment_name)))
        return loaded

    def fit(self) -> None:
        finished = False
        try:
            if self._exp is not None and self._exp.exp.init_exp_only:
                self._build_memory_only()
            else:
                try:
                    super().fit()
                except _AlreadyTrained as done:
                    logger.warning("%s", done)
            finished = True
        finally:
            if self._exp is not None:
                self._exp.close(wait=finished)  # a failed or interrupted run does not wait on summaries
            self._adca.close()

    def _build_memory_only(self) -> None:
        """``init_exp_only``: build the memory from the training tasks and stop (no update, no checkpoint)."""
        assert self._exp is not None and isinstance(self.async_rollout_manager, StepRolloutManager)
        self.checkpoint_manager.update_weights(0)
        metrics = self._exp.initial_summary(
            initial_rollouts(self, self.async_rollout_manager.inner, self._exp.exp.init_exp_max_tasks))
        if metrics["exp/summary_stored"] == 0 and metrics["exp/summary_failed"] > 0:
            raise RuntimeError(
                f"init_exp_only: every summary request to the memory service at {self._exp.memory.base_url} "
                "failed, so no memory was built; see the warnings above (is the service up, and its "
                "exp_summarizer LLM?)")
        logger.info("init_exp_only: memory %r built (%d experiences stored); not training, as configured",
                    self._exp.workspace_id, int(metrics["exp/summary_stored"]))

    # ------------------------------------------------------------------ shared prompts
    def _share_prompts(self, batch: DataProto) -> DataProto:
        """Ask the actor/reference engines to compute each GRPO group's prompt once in this pass.

        verl's switch ``actor_rollout_ref.actor.use_prefix_grouper`` (already read by verl's ``_balance_batch``
        to keep groups together) travels to the workers in ``meta_info``, which verl turns into every
        micro-batch's non-tensor data; the engine (:mod:`agentevolver.verl.shared_prefix.engine`) then groups
        samples whose prompt tokens are identical. Off, the key is absent and verl's own forward runs.
        """
        if getattr(self, "use_prefix_grouper", False):
            batch.meta_info[SHARED_PROMPTS] = True
        return batch

    def _compute_old_log_prob(self, batch: DataProto) -> tuple[DataProto, float]:
        return super()._compute_old_log_prob(self._share_prompts(batch))

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        return super()._compute_ref_log_prob(self._share_prompts(batch))

    # ------------------------------------------------------------------ the update's stages
    def _update_actor(self, batch: DataProto) -> DataProto:
        """Stages 5-12 of the step (module docstring), on the episode rows verl hands over."""
        self._timings = {}
        metrics: dict[str, float] = {}
        step = self.global_steps
        with self._stage("faults"):
            metrics.update(failure_metrics(batch.non_tensor_batch))
            exclude_failed(batch, recompute_advantages=self._recompute_advantages)
        with self._stage("adca_judge"):
            metrics.update(self._adca.apply(batch, step))
        with self._stage("dump"):
            metrics.update(self._dump(batch, step))
        with self._stage("episode_metrics"):
            metrics.update(episode_metrics(batch.non_tensor_batch))
        with self._stage("sample_rows"):
            rows, row_metrics = self._sample_rows(batch)
            metrics.update(row_metrics)
        with self._stage("exp_mask"):
            exp_token_mask(rows, self.config.exp_manager.off_cliprange_high)
        with self._stage("actor_update"):
            output = super()._update_actor(self._share_prompts(rows))
        with self._stage("memory_summary"):
            if self._exp is not None:
                metrics.update(self.async_rollout_manager.last_plan)
                metrics.update(self._exp.after_step(batch, step))
        output.meta_info["metrics"].update(metrics)
        output.meta_info["metrics"].update(self._timings)
        return output

    def _recompute_advantages(self, batch: DataProto) -> DataProto:
        """verl's ``compute_advantage`` with the arguments its ``fit`` passes (the ``faults`` stage)."""
        from verl.trainer.ppo.ray_trainer import compute_advantage

        algorithm = self.config.algorithm
        return compute_advantage(
            batch, adv_estimator=algorithm.adv_estimator, gamma=algorithm.gamma, lam=algorithm.lam,
            num_repeat=self.config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=algorithm.get("norm_adv_by_std_in_grpo", True), config=algorithm)

    def _dump(self, batch: DataProto, step: int) -> dict[str, float]:
        """Write the step's rollout dump. A full disk or another write error loses the dump, not the run: a
        warning names the file and what it would have held, and ``dump/lost_episodes`` counts them."""
        dump = self.config.agent_flow.dump
        if not dump.enable:
            return {}
        records = dump_records(batch, step, bool(dump.include_messages))
        try:
            path = RolloutDumpWriter(str(dump.dir)).write_records(step, records)
        except OSError as err:
            logger.warning("rollout dump of step %d NOT written to %s (%s): its %d episodes are lost from the dump; "
                           "training goes on (free space there, or move agent_flow.dump.dir)", step, dump.dir,
                           err.strerror or err, len(records))
            return {"dump/lost_episodes": float(len(records))}
        logger.info("rollout dump of step %d: %s", step, path)
        return {"dump/lost_episodes": 0.0}

    def _sample_rows(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        config = self.config
        rollout_corr = config.algorithm.get("rollout_correction", None)
        bypass = bool(rollout_corr and rollout_corr.get("bypass_mode", False))
        return expand_sample_rows(
            batch,
            pad_token_id=_pad_id(self.tokenizer),
            rows_per_minibatch=minibatch_rows(config.actor_rollout_ref.actor.ppo_mini_batch_size,
                                              config.actor_rollout_ref.rollout.n),
            bypass=bypass,
            compute_old=self._padded(lambda rows: self._compute_old_log_prob(rows)[0].batch["old_log_probs"]),
            compute_ref=self._padded(lambda rows: self._compute_ref_log_prob(rows).batch["ref_log_prob"]),
        )

    def _padded(self, compute: Callable[[DataProto], torch.Tensor]) -> Callable[[DataProto], torch.Tensor]:
        """``compute`` on rows padded to the actor's worker count (verl splits a batch evenly across them)."""
        from verl.protocol import pad_dataproto_to_divisor

        def run(rows: DataProto) -> torch.Tensor:
            padded, pad = pad_dataproto_to_divisor(rows, max(int(self.actor_rollout_wg.world_size), 1))
            # verl's workers read the rows' token counts (MFU) from meta_info, as fit() sets for a batch
            padded.meta_info["global_token_num"] = torch.sum(padded.batch["attention_mask"], dim=-1).tolist()
            values = compute(padded)
            return values[: len(values) - pad] if pad else values

        return run


class _AlreadyTrained(Exception):
    """Raised out of verl's ``fit`` by :meth:`AgentEvolverTrainer._load_checkpoint`; ``fit`` ends quietly."""


def check_stages(config: Any, settings: Any, *, use_critic: bool) -> None:
    """The combinations the step's stages refuse, as a :class:`ConfigError`: run by ``main_ppo`` on the driver
    (before Ray starts) and again when the trainer is built."""
    reason = refusal(
        multi_sample=settings.agent_flow.context_template != "linear",
        adv_estimator=str(config.algorithm.adv_estimator),
        use_critic=use_critic,
        distillation=bool((config.get("distillation") or {}).get("enabled", False)),
    )
    if reason:
        raise ConfigError(reason)
    AdcaStage(config, 1, settings=settings)  # its checks (estimator) run in the constructor; no client is built
    check_shared_prompts(config)


def _pad_id(tokenizer: Any) -> int:
    for value in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if value is not None:
            return int(value)
    return 0


def exp_token_mask(batch: DataProto, off_cliprange_high: float) -> None:
    """Each row's ``exp_mask`` (training context differs from generation context) as the per-token mask the
    ``exp_on_off`` loss reads, and its clip in ``meta_info`` (both travel to the actor)."""
    flags = batch.non_tensor_batch.pop("exp_mask", None)
    if flags is None:
        return
    response_mask = batch.batch["response_mask"]
    per_sample = torch.as_tensor(np.asarray(flags, dtype=np.float32), device=response_mask.device)
    batch.batch["exp_mask"] = per_sample[:, None] * response_mask.to(torch.float32)
    batch.meta_info["exp_off_cliprange_high"] = float(off_cliprange_high)
