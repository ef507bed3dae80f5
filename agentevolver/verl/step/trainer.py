"""The training loop and its step: verl's ``RayPPOTrainer`` workers, this project's step, read top to bottom.

We build on verl's legacy trainer (``trainer.use_v1=false``: its workers, resource pools, checkpoints and
validation, and no TransferQueue service), and write the loop and the step ourselves, so every stage is
named once, in order, in :meth:`AgentEvolverTrainer.train_step`, and timed on its own (``timing_s/<stage>``;
where verl has a name for the same work, it is verl's, so verl's per-token timing metrics still apply).

**One training step** (``*`` = this project's stage):

1. ``tasks``: a batch of task rows (:class:`~agentevolver.verl.task_dataset.TaskDataset`: the task manager's
   mixture), each task with a fresh GRPO group id, repeated ``rollout.n`` times for the rollout
2. ``*`` ``experience_plan`` (Self-Navigating): per row, whether the episode gets retrieved experience and
   whether training strips it (:meth:`~agentevolver.module.exp_manager.ExperienceManager.plan`)
3. ``gen``: verl's agent-loop manager runs the episodes (:mod:`agentevolver.verl.agent_loop`); each episode's
   reward is its score (env ``/evaluate`` or the task's grader); the scores become ``token_level_scores``
4. ``*`` ``faults``: episodes whose environment, rollout server or grader failed are counted and kept out
   of the update; a step with too many of them stops the run, naming the service (:mod:`.faults`)
5. ``*`` ``sample_rows``: the earlier samples of multi-sample episodes become rows of their own, padded to
   whole mini-batches (:mod:`.sample_rows`)
6. ``old_log_prob`` and ``ref``: the actor's and the reference's log-probs, once, over all rows (the
   rollout's in bypass mode), with each GRPO group's prompt computed once when shared prompts are on;
   ``values`` for a critic
7. ``*`` ``judge`` (Self-Attributing, ``algorithm.adv_estimator=adca_grpo``): step labels from the judge LLM
   or the environment (:class:`~agentevolver.module.adv_processor.AdcaStage`)
8. ``adv``: rollout correction, then the advantages on the episode rows (each episode counts once in its
   group): verl's estimator, plus ADCA's step credit; the added rows take their episode's
   (:mod:`.advantage`)
9. ``*`` ``dump``: ``rollouts/step_<N>.jsonl`` with the advantages trained on, before the update, so a crash
   in the update or the checkpoint never loses a step's episodes; ``*`` ``episode_metrics``
10. ``*`` ``exp_mask`` (Self-Navigating): the per-token off-policy mask and clip of the ``exp_on_off`` loss
11. ``update_critic`` / ``update_actor``: verl's updates (the actor's loss reads ``exp_mask``:
    :meth:`AgentEvolverTrainer.init_workers`)
12. ``*`` ``memory_summary`` (Self-Navigating): every ``memory.updated_freq`` steps the episodes are
    summarised into the memory service, in the background
13. ``save_checkpoint``, ``update_weights`` (to the rollout servers), ``testing`` (validation, and a second
    pass with another experience mode where ``exp_manager.val_compare_mode`` asks), metrics

:attr:`AgentEvolverTrainer.STAGES` is this list, in order; :meth:`AgentEvolverTrainer.fit` is the loop around
it (resume, the initial memory, validation before training, the progress bar, logging; the first step's metrics
also carry the training dataset's ``tasks/*``: the mixture's size and synthetic share, Self-Questioning's
generation funnel).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict
from tqdm import tqdm
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentevolver.config import validate_config
from agentevolver.config.schema import RolloutMode
from agentevolver.errors import ConfigError
from agentevolver.finished_run import already_trained_message
from agentevolver.module.adv_processor import AdcaStage
from agentevolver.module.agent_flow.dump import RolloutDumpWriter
from agentevolver.module.exp_manager.manager import ExperienceManager, compare_key
from agentevolver.verl.shared_prefix.checks import check_shared_prompts
from agentevolver.verl.shared_prefix.layout import SWITCH as SHARED_PROMPTS
from agentevolver.verl.step.advantage import episode_advantages
from agentevolver.verl.step.advantage import register as register_adca_estimator
from agentevolver.verl.step.episode_metrics import episode_metrics
from agentevolver.verl.step.faults import check_failed_share, exclude_failed, failure_metrics
from agentevolver.verl.step.rollout_inputs import initial_rollouts, rollout_inputs, task_batch
from agentevolver.verl.step.sample_rows import (
    episode_rows,
    expand_sample_rows,
    minibatch_rows,
    refusal,
    spread_advantages,
)

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
    """verl's legacy trainer with this project's loop and step (module docstring)."""

    #: The step's stages in the order they run, each timed as ``timing_s/<name>`` (module docstring).
    STAGES = ("tasks", "experience_plan", "gen", "faults", "sample_rows", "old_log_prob", "ref", "values", "judge",
              "adv", "dump", "episode_metrics", "exp_mask", "update_critic", "update_actor", "memory_summary",
              "save_checkpoint", "update_weights", "testing")

    def __init__(self, *args: Any, settings: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        register_adca_estimator()
        self.settings = settings if settings is not None else validate_config(self.config)
        check_stages(self.config, self.settings, use_critic=bool(self.use_critic))
        self._adca = AdcaStage(self.config, self.total_training_steps, settings=self.settings)
        exp = ExperienceManager.from_config(self.config, self.settings)
        self._exp: ExperienceManager | None = exp if exp.active else None
        self._timings: dict[str, float] = {}
        #: The experience mode of the validation pass running now, when it is val_compare_mode's second one.
        self._val_mode: RolloutMode | None = None

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timings[name] = self._timings.get(name, 0.0) + time.perf_counter() - started

    # ------------------------------------------------------------------ start-up
    def init_workers(self) -> None:
        super().init_workers()
        self._give_actor_exp_loss()
        if self._exp is not None:
            self._exp.check_memory()

    def _give_actor_exp_loss(self) -> None:
        """The actor's loss through verl's ``set_loss_fn``: verl's ``ppo_loss`` that also shows a registered
        policy loss the batch's ``exp_mask`` (equal to verl's own when the batch has none)."""
        from verl.utils.config import omega_conf_to_dataclass

        from agentevolver.verl.step.exp_loss import exp_aware_ppo_loss

        if (self.config.get("distillation") or {}).get("enabled", False):
            return  # verl's distillation loss stays (it does not see exp_mask: exp_on_off acts as vanilla there)
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(exp_aware_ppo_loss, actor_config))

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """verl's validation builds its rollout rows here (the step does not call it: :func:`rollout_inputs`);
        the experience plan of validation rows is drawn on them (verl seam, :mod:`agentevolver.verl.patches`)."""
        rows = super()._get_gen_batch(batch)
        if self._exp is not None:
            self._exp.plan(rows, validate=True, step=self.global_steps, rollout_mode=self._val_mode)
        return rows

    def _validations(self, *, final: bool) -> dict[str, float]:
        """verl's validation, then, where ``exp_manager.val_compare_mode`` asks for it (at the final step, or at
        every validation), the same tasks again on the same weights with that experience mode; the second pass's
        metrics are renamed ``val-exp_<mode>-core/...`` / ``val-exp_<mode>-aux/...``, so one run reports
        validation with and without experience side by side."""
        metrics = self._validate()
        exp = self._exp.exp if self._exp is not None else None
        if exp is None or exp.val_compare_mode is None or not (final or exp.val_compare_at == "every"):
            return metrics
        with self._second_validation(exp.val_compare_mode):
            compared = self._validate()
        metrics.update({compare_key(key, exp.val_compare_mode): value for key, value in compared.items()})
        return metrics

    @contextmanager
    def _second_validation(self, mode: RolloutMode) -> Iterator[None]:
        """While the second pass runs: its rows are planned in ``mode``, and verl's generation dump
        (``trainer.validation_data_dir``, ``<step>.jsonl``, opened for writing) goes to ``<dir>/exp_<mode>``, so
        it does not overwrite the first pass's."""
        dump_dir = self.config.trainer.get("validation_data_dir", None)
        self._val_mode = mode
        if dump_dir:
            with open_dict(self.config):
                self.config.trainer.validation_data_dir = os.path.join(str(dump_dir), f"exp_{mode}")
        try:
            yield
        finally:
            self._val_mode = None
            if dump_dir:
                with open_dict(self.config):
                    self.config.trainer.validation_data_dir = dump_dir

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        """Resume, build the initial memory, validate before training, then :meth:`train_step` per batch."""
        from verl.utils.skip.skip_manager import SkipManager

        from agentevolver.verl.tracking import RunTracking

        finished = False
        try:
            tracking = RunTracking(project_name=self.config.trainer.project_name,
                                   experiment_name=self.config.trainer.experiment_name,
                                   default_backend=self.config.trainer.logger,
                                   config=OmegaConf.to_container(self.config, resolve=True))
            self.global_steps = 0
            self._load_checkpoint()
            if self.global_steps >= self.total_training_steps > 0:
                logger.warning("%s", already_trained_message(
                    self.global_steps, self.total_training_steps, str(self.config.trainer.default_local_dir),
                    str(self.config.trainer.experiment_name)))
                finished = True
                return
            self.checkpoint_manager.update_weights(self.global_steps)
            if self._exp is not None and self._exp.exp.init_exp_only:
                self._build_memory_only()
                finished = True
                return
            if self._exp is not None and self._exp.exp.init_exp_before_training and self.global_steps == 0:
                self._exp.initial_summary(initial_rollouts(self, self._exp.exp.init_exp_max_tasks))
            SkipManager.init(self.config)
            if self.config.trainer.get("val_before_train", True):
                val_metrics = self._validations(final=self.total_training_steps == 0)
                tracking.log(data=val_metrics, step=self.global_steps)
                if self.config.trainer.get("val_only", False):
                    finished = True
                    return
            self._train(tracking)
            finished = True
        finally:
            if self._exp is not None:
                self._exp.close(wait=finished)  # a failed or interrupted run does not wait on summaries
            self._adca.close()

    def _train(self, tracking: Any) -> None:
        from verl.utils.skip.skip_manager import SkipManager

        # the epoch a resumed run is in: the steps done so far over the batches per epoch (verl's rule)
        start_epoch = self.global_steps // max(len(self.train_dataloader), 1)
        progress = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
        self.global_steps += 1
        SkipManager.set_step(self.global_steps)
        profiled = self.config.global_profiler.steps or []
        continuous = bool(self.config.global_profiler.profile_continuous_steps)
        # what building the training dataset measured (tasks/*: mixture size, task generation), logged with this
        # process's first step so metrics.jsonl holds it (again after a resume: the dataset was built again)
        dataset_metrics = dict(getattr(self.train_dataset, "metrics", {}))
        for epoch in range(start_epoch, self.config.trainer.total_epochs):
            for rows in self.train_dataloader:
                step = self.global_steps
                profile = step in profiled
                self._start_profiling(profile and not (continuous and step - 1 in profiled))
                metrics = {**dataset_metrics, **self.train_step(rows, epoch=epoch)}
                dataset_metrics = {}
                last_profiled = profile and (step == max(profiled) or step >= self.total_training_steps)
                self._stop_profiling(profile and not (continuous and step + 1 in profiled), run_command=last_profiled)
                tracking.log(data=metrics, step=step)
                progress.update(1)
                if step >= self.total_training_steps:
                    if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                        self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=True)
                    progress.close()
                    return
                self.global_steps += 1
                SkipManager.set_step(self.global_steps)
        progress.close()

    # ------------------------------------------------------------------ the step
    def train_step(self, rows: dict[str, Any], *, epoch: int = 0) -> dict[str, float]:
        """One training step on a batch of task rows; returns the step's metrics (module docstring)."""
        from verl.trainer.ppo.metric_utils import (
            compute_data_metrics,
            compute_throughout_metrics,
            compute_timing_metrics,
            compute_variance_proxy_metrics,
        )

        config = self.config
        step = self.global_steps
        n = int(config.actor_rollout_ref.rollout.n)
        self._timings = {}
        metrics: dict[str, float] = {}
        if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
            self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
        started = time.perf_counter()

        with self._stage("tasks"):
            batch = task_batch(rows)
            batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature  # the log-prob passes'
            inputs = rollout_inputs(batch)
            inputs.meta_info.update(global_steps=step, temperature=config.actor_rollout_ref.rollout.temperature)
            inputs = inputs.repeat(repeat_times=n, interleave=True)
        with self._stage("experience_plan"):
            if self._exp is not None:
                metrics.update(self._exp.plan(inputs, validate=False, step=step))
        with self._stage("gen"):
            output = self.async_rollout_manager.generate_sequences(inputs)
            self.checkpoint_manager.sleep_replicas()
            self._timings.update(output.meta_info.pop("timing", {}))
            batch = batch.repeat(repeat_times=n, interleave=True).union(output)
            if "response_mask" not in batch.batch:
                from verl.trainer.ppo.ray_trainer import compute_response_mask

                batch.batch["response_mask"] = compute_response_mask(batch)
            batch.batch["token_level_scores"] = self._scores(batch)
        with self._stage("faults"):
            metrics.update(failure_metrics(batch.non_tensor_batch))
            check_failed_share(batch.non_tensor_batch, float(config.agent_flow.max_failed_share), step)
            exclude_failed(batch)
        with self._stage("sample_rows"):
            if config.trainer.balance_batch:
                self._balance_batch(batch, metrics=metrics)
            episode_count = len(batch)
            batch, row_metrics = self._sample_rows(batch)
            metrics.update(row_metrics)
            self._share_prompts(batch)
        with self._stage("old_log_prob"):
            batch = self._old_log_probs(batch, metrics)
        with self._stage("ref"):
            if self.use_reference_policy:
                batch = batch.union(self._compute_ref_log_prob(batch))
        with self._stage("values"):
            if self.use_critic:
                batch = batch.union(self._compute_values(batch))
        episodes = episode_rows(batch, episode_count)
        with self._stage("judge"):
            labels = self._adca.label(episodes, step)
        with self._stage("adv"):
            batch, episodes = self._advantages(batch, episodes, labels, step, metrics)
        with self._stage("dump"):
            metrics.update(self._dump(episodes, step))
        with self._stage("episode_metrics"):
            metrics.update(episode_metrics(episodes.non_tensor_batch))
        with self._stage("exp_mask"):
            exp_token_mask(batch, config.exp_manager.off_cliprange_high)
        with self._stage("update_critic"):
            if self.use_critic:
                metrics.update(_reduced(self._update_critic(batch)))
        trains_actor = config.trainer.critic_warmup <= step
        with self._stage("update_actor"):
            if trains_actor:
                metrics.update(_reduced(self._update_actor(batch)))
        with self._stage("memory_summary"):
            if self._exp is not None:
                metrics.update(self._exp.after_step(episodes, step))
        with self._stage("save_checkpoint"):
            if trains_actor and self._checkpoint_due(step):
                self._save_checkpoint()
        with self._stage("update_weights"):
            self.checkpoint_manager.update_weights(step)
        with self._stage("testing"):
            if config.trainer.test_freq > 0 and (step >= self.total_training_steps or step % config.trainer.test_freq == 0):
                metrics.update(self._validations(final=step >= self.total_training_steps))
        self._timings["step"] = time.perf_counter() - started
        self.max_steps_duration = max(getattr(self, "max_steps_duration", 0.0), self._timings["step"])

        metrics.update({"training/global_step": step, "training/epoch": epoch})
        metrics.update(compute_data_metrics(batch=episodes, use_critic=self.use_critic))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=self._timings))
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=self._timings,
                                                  n_gpus=self.resource_pool_manager.get_n_gpus()))
        metrics.update(compute_variance_proxy_metrics(batch=episodes, gradient_norm=metrics.get("actor/grad_norm")))
        return metrics

    # ------------------------------------------------------------------ stage helpers
    def _scores(self, batch: DataProto) -> torch.Tensor:
        """The episodes' rewards as token-level scores: the agent loop's, or a colocated reward model's."""
        from verl.trainer.ppo.reward import extract_reward

        if self.use_rm and "rm_scores" not in batch.batch:
            batch.union(self.reward_loop_manager.compute_rm_score(batch))
        scores, extra = extract_reward(batch)
        if extra:
            batch.non_tensor_batch.update({key: np.array(values) for key, values in extra.items()})
        return scores

    def _sample_rows(self, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        config = self.config
        return expand_sample_rows(
            batch, pad_token_id=_pad_id(self.tokenizer),
            rows_per_minibatch=minibatch_rows(config.actor_rollout_ref.actor.ppo_mini_batch_size,
                                              config.actor_rollout_ref.rollout.n),
            bypass=self._bypass)

    @property
    def _bypass(self) -> bool:
        """Rollout-correction bypass mode: the rollout's log-probs are the old ones (no old-log-prob pass)."""
        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        return bool(rollout_corr and rollout_corr.get("bypass_mode", False))

    def _share_prompts(self, batch: DataProto) -> None:
        """Ask the actor/reference engines to compute each GRPO group's prompt once in this step's passes.

        verl's switch ``actor_rollout_ref.actor.use_prefix_grouper`` (already read by verl's ``_balance_batch``
        to keep groups together) travels to the workers in ``meta_info``, which verl turns into every
        micro-batch's non-tensor data; the engine (:mod:`agentevolver.verl.shared_prefix.engine`) then groups
        samples whose prompt tokens are identical. Off, the key is absent and verl's own forward runs.
        """
        if getattr(self, "use_prefix_grouper", False):
            batch.meta_info[SHARED_PROMPTS] = True

    def _old_log_probs(self, batch: DataProto, metrics: dict[str, float]) -> DataProto:
        """The old log-probs of every row: the rollout's in bypass mode, else the actor's pass (with
        ``actor/entropy`` and the rollout-vs-actor log-prob metrics)."""
        from verl.trainer.ppo.core_algos import agg_loss

        actor = self.config.actor_rollout_ref.actor
        if self._bypass:
            from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

            apply_bypass_mode(batch=batch, rollout_corr_config=self.config.algorithm.rollout_correction,
                              policy_loss_config=actor.policy_loss)
            return batch
        old, mfu = self._compute_old_log_prob(batch)
        entropy = agg_loss(loss_mat=old.batch["entropys"], loss_mask=batch.batch["response_mask"],
                           loss_agg_mode=actor.loss_agg_mode, loss_scale_factor=actor.loss_scale_factor)
        metrics.update({"actor/entropy": entropy.detach().item(), "perf/mfu/actor_infer": mfu})
        old.batch.pop("entropys")
        batch = batch.union(old)
        if "rollout_log_probs" in batch.batch:
            from verl.utils.debug.metrics import calculate_debug_metrics

            metrics.update(calculate_debug_metrics(batch))
        return batch

    def _advantages(self, batch: DataProto, episodes: DataProto, labels: Any, step: int,
                    metrics: dict[str, float]) -> tuple[DataProto, DataProto]:
        """Rollout correction over every row, the advantages of the episode rows, spread to the added rows."""
        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        if rollout_corr is not None and "rollout_log_probs" in batch.batch and not self._bypass:
            from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

            batch, corr_metrics = compute_rollout_correction_and_add_to_batch(batch, rollout_corr)
            metrics.update(corr_metrics)
            episodes = episode_rows(batch, len(episodes))
        episodes, adv_metrics = episode_advantages(episodes, config=self.config, adca=self._adca, labels=labels,
                                                   step=step, kl_ctrl=getattr(self, "kl_ctrl_in_reward", None))
        metrics.update(adv_metrics)
        if len(batch) == len(episodes):  # no earlier-sample rows: the episode rows are the batch
            return episodes, episodes
        metrics.update(spread_advantages(batch, episodes))
        return batch, episodes

    def _checkpoint_due(self, step: int) -> bool:
        """verl's rule: every ``save_freq`` steps, at the last step, or when the ESI instance is expiring."""
        from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

        freq = int(self.config.trainer.save_freq)
        expiring = should_save_ckpt_esi(max_steps_duration=getattr(self, "max_steps_duration", 0.0),
                                        redundant_time=self.config.trainer.esi_redundant_time)
        return freq > 0 and (step >= self.total_training_steps or step % freq == 0 or expiring)

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

    def _build_memory_only(self) -> None:
        """``init_exp_only``: build the memory from the training tasks and stop (no update, no checkpoint)."""
        assert self._exp is not None
        metrics = self._exp.initial_summary(initial_rollouts(self, self._exp.exp.init_exp_max_tasks))
        if metrics["exp/summary_stored"] == 0 and metrics["exp/summary_failed"] > 0:
            raise RuntimeError(
                f"init_exp_only: every summary request to the memory service at {self._exp.memory.base_url} "
                "failed, so no memory was built; see the warnings above (is the service up, and its "
                "exp_summarizer LLM?)")
        logger.info("init_exp_only: memory %r built (%d experiences stored); not training, as configured",
                    self._exp.workspace_id, int(metrics["exp/summary_stored"]))


def _reduced(output: DataProto) -> dict[str, float]:
    from verl.utils.metric import reduce_metrics

    return reduce_metrics(output.meta_info["metrics"])


def check_stages(config: Any, settings: Any, *, use_critic: bool) -> None:
    """The combinations the step's stages refuse, as a :class:`ConfigError`: run by ``main_ppo`` on the driver
    (before Ray starts) and again when the trainer is built."""
    estimator = str(config.algorithm.adv_estimator)
    if estimator == "remax":
        raise ConfigError("algorithm.adv_estimator=remax needs a greedy baseline rollout per task, which this "
                          "trainer's step does not run; choose grpo, rloo or another estimator")
    if config.trainer.get("rollout_data_dir"):
        raise ConfigError("trainer.rollout_data_dir (verl's generation log) is not written by this trainer: every "
                          "step's episodes are in the rollout dump (agent_flow.dump, docs/rollout_dumps.md); "
                          "remove trainer.rollout_data_dir")
    reason = refusal(
        multi_sample=settings.agent_flow.context_template != "linear",
        adv_estimator=estimator,
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
