"""The training loop and its step: verl's ``RayPPOTrainer`` workers, this project's step, read top to bottom.

We build on verl's legacy trainer (``trainer.use_v1=false``: its workers, resource pools, checkpoints and
validation, and no TransferQueue service), and write the loop and the step ourselves, so every stage is
named once, in order, in :meth:`AgentEvolverTrainer.train_step`, and timed on its own (``timing_s/<stage>``;
where verl has a name for the same work, it is verl's, so verl's per-token timing metrics still apply).

**One training step** is :data:`STEP`, a list of named stages (``*`` = this project's). Each stage is a function
``stage(state, trainer) -> state`` in its own module under :mod:`agentevolver.verl.step` (the contract:
:mod:`.state`), timed as ``timing_s/<name>``:

1. ``tasks``: a batch of task rows (:class:`~agentevolver.verl.task_dataset.TaskDataset`: the task manager's
   mixture), each task with a fresh GRPO group id, repeated ``rollout.n`` times for the rollout
   (:mod:`.rollout_inputs`)
2. ``*`` ``experience_plan`` (Self-Navigating): per row, whether the episode gets retrieved experience and
   whether training strips it (:mod:`.experience`)
3. ``gen``: verl's agent-loop manager runs the episodes (:mod:`agentevolver.verl.agent_loop`; :mod:`.rollout`)
4. ``reward``: each episode's score (env ``/evaluate`` or the task's grader, from the agent loop; a colocated
   reward model's) as ``token_level_scores`` (:mod:`.reward`)
   ``*`` ``seat_rows``: a game's trained seats become episode rows of their own, grouped per (task, seat)
   (:mod:`.seat_rows`)
5. ``*`` ``faults``: episodes whose environment, rollout server or grader failed are counted and kept out
   of the update; a step with too many of them stops the run, naming the service (:mod:`.faults`)
6. ``balance``: verl's batch balancing across data-parallel ranks (:mod:`.sample_rows`)
7. ``*`` ``sample_rows``: the earlier samples of multi-sample episodes become rows of their own, padded to
   whole mini-batches; shared prompts asked for (:mod:`.sample_rows`)
8. ``old_log_prob``, ``ref``, ``values``: the actor's and the reference's log-probs, once, over all rows (the
   rollout's in bypass mode), and a critic's values (:mod:`.log_probs`)
9. ``*`` ``judge`` (Self-Attributing, ``algorithm.adv_estimator=adca_grpo``): step labels from the judge LLM
   or the environment (:mod:`.judge`)
10. ``rollout_correction``, ``kl_in_reward``, ``adv``: verl's rollout correction over every row; the rewards
    trained on; the advantages on the episode rows (each episode counts once in its group): verl's
    estimator plus ADCA's step credit; the added rows take their episode's (:mod:`.advantage`)
11. ``*`` ``dump``: ``rollouts/step_<N>.jsonl`` with the advantages trained on, before the update, so a crash
    in the update or the checkpoint never loses a step's episodes (:mod:`.dump`); ``*`` ``episode_metrics``
12. ``*`` ``exp_mask`` (Self-Navigating): the per-token off-policy mask and clip of the ``exp_on_off`` loss
13. ``update_critic`` / ``update_actor``: verl's updates (the actor's loss reads ``exp_mask``:
    :meth:`AgentEvolverTrainer.init_workers`; :mod:`.update`)
14. ``*`` ``memory_summary`` (Self-Navigating): every ``memory.updated_freq`` steps the episodes are
    summarised into the memory service, in the background
15. ``save_checkpoint``, ``update_weights`` (to the rollout servers) (:mod:`.checkpoint`), ``testing``
    (validation, and a second pass with another experience mode where ``exp_manager.val_compare_mode`` asks;
    :mod:`.testing`), ``metrics`` (verl's summary metrics of the step; :mod:`.step_metrics`)

**Async training** (``trainer.mode=async``, :mod:`agentevolver.verl.async_loop`) runs the same stages split in
two: :data:`ROLLOUT_STAGES` (1-4 and ``seat_rows``) for later steps in a producer thread, the rest for the current
step in the main thread, with the weight sync and validation (:data:`PAUSED_STAGES`) while no rollout runs.

:attr:`AgentEvolverTrainer.STAGES` is the stages' names, in order; :meth:`AgentEvolverTrainer.fit` is the loop around
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

from omegaconf import OmegaConf, open_dict
from tqdm import tqdm
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from agentevolver.config.schema import RolloutMode
from agentevolver.errors import ConfigError
from agentevolver.finished_run import already_trained_message
from agentevolver.module.adv_processor import AdcaStage
from agentevolver.module.exp_manager.manager import ExperienceManager, compare_key
from agentevolver.verl.async_loop import RolloutAhead, TaskBatch, async_settings, record_staleness
from agentevolver.verl.shared_prefix.checks import check_shared_prompts
from agentevolver.verl.step import (
    advantage,
    checkpoint,
    dump,
    episode_metrics,
    experience,
    faults,
    judge,
    log_probs,
    reward,
    rollout,
    rollout_inputs,
    sample_rows,
    seat_rows,
    step_metrics,
    testing,
    update,
)
from agentevolver.verl.step.state import Stage, StepState, run_stages

__all__ = ["PAUSED_STAGES", "ROLLOUT_STAGES", "STEP", "AgentEvolverTrainer", "check_stages"]

logger = logging.getLogger(__name__)


#: The training step: its stages in the order they run (module docstring). Each name is the stage's timer.
STEP: tuple[Stage, ...] = (
    Stage("tasks", rollout_inputs.task_rows),
    Stage("experience_plan", experience.plan_experience),
    Stage("gen", rollout.generate),
    Stage("reward", reward.score),
    Stage("seat_rows", seat_rows.seat_rows),
    Stage("faults", faults.leave_out_failures),
    Stage("balance", sample_rows.balance),
    Stage("sample_rows", sample_rows.add_sample_rows),
    Stage("old_log_prob", log_probs.old_log_probs),
    Stage("ref", log_probs.reference_log_probs),
    Stage("values", log_probs.critic_values),
    Stage("judge", judge.label_steps),
    Stage("rollout_correction", advantage.correct_rollout),
    Stage("kl_in_reward", advantage.rewards_trained_on),
    Stage("adv", advantage.advantages),
    Stage("dump", dump.write_dump),
    Stage("episode_metrics", episode_metrics.record_episode_metrics),
    Stage("exp_mask", experience.off_policy_mask),
    Stage("update_critic", update.update_critic),
    Stage("update_actor", update.update_actor),
    Stage("memory_summary", experience.summarise_into_memory),
    Stage("save_checkpoint", checkpoint.save_checkpoint),
    Stage("update_weights", checkpoint.sync_weights),
    Stage("testing", testing.validate),
    Stage("metrics", step_metrics.summary_metrics),
)


#: The stages that make a step's episodes; async training runs them ahead, in a thread (:mod:`..async_loop`).
ROLLOUT_STAGES: tuple[Stage, ...] = STEP[: [stage.name for stage in STEP].index("faults")]
#: The stages that need the rollout servers to themselves (async training pauses the rollout around them).
PAUSED_STAGES = ("update_weights", "testing")


class AgentEvolverTrainer(RayPPOTrainer):
    """verl's legacy trainer with this project's loop and step (module docstring)."""

    #: The step's stage names in the order they run, each timed as ``timing_s/<name>`` (:data:`STEP`).
    STAGES = tuple(stage.name for stage in STEP)

    def __init__(self, *args: Any, settings: Any, **kwargs: Any) -> None:
        """verl's trainer, plus the step's stage objects, built from ``settings`` (this project's sections,
        validated once by the task runner) before any worker starts, so a bad ADCA or memory config fails in
        seconds."""
        super().__init__(*args, **kwargs)
        advantage.register()
        self.settings = settings
        check_stages(self.config, self.settings, use_critic=bool(self.use_critic))
        #: Self-Attributing's judge stage (labels, and the step credit fused into the advantages).
        self.adca = AdcaStage(self.config, self.total_training_steps, settings=self.settings)
        exp = ExperienceManager.from_config(self.config, self.settings)
        #: Self-Navigating's experience manager; None when it is off (its stages then do nothing).
        self.experience: ExperienceManager | None = exp if exp.active else None
        #: The experience mode of the validation pass running now, when it is val_compare_mode's second one.
        self._val_mode: RolloutMode | None = None
        #: ``trainer.max_staleness`` of async training (``trainer.mode=async``); None: the synchronous loop.
        self.staleness_bound: int | None = async_settings(self.config)
        #: Async training's producer thread while the loop runs (:mod:`agentevolver.verl.async_loop`).
        self.rollout_ahead: RolloutAhead | None = None

    @property
    def bypass(self) -> bool:
        """Rollout-correction bypass mode: the rollout's log-probs are the old ones (no old-log-prob pass)."""
        rollout_corr = self.config.algorithm.get("rollout_correction", None)
        return bool(rollout_corr and rollout_corr.get("bypass_mode", False))

    # ------------------------------------------------------------------ start-up
    def init_workers(self) -> None:
        """verl's start of the workers, with the rollout server and agent-loop worker processes started beside
        the training workers (``trainer.prestart``, :mod:`agentevolver.verl.prestart`)."""
        from agentevolver.verl import in_process, prestart

        in_process.choose(self.config)  # before prestart: in-process workers need no process started early
        started = prestart.begin(self.config)
        try:
            super().init_workers()
        finally:
            left = prestart.release()
        if left:
            logger.warning("prestart: %s started early but not taken over by verl (stopped); started: %s", left,
                           started)
        self._give_actor_exp_loss()
        if self.experience is not None:
            self.experience.check_memory()

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
        if self.experience is not None:
            self.experience.plan(rows, validate=True, step=self.global_steps, rollout_mode=self._val_mode)
        return rows

    def validations(self, *, final: bool) -> dict[str, float]:
        """verl's validation, then, where ``exp_manager.val_compare_mode`` asks for it (at the final step, or at
        every validation), the same tasks again on the same weights with that experience mode; the second pass's
        metrics are renamed ``val-exp_<mode>-core/...`` / ``val-exp_<mode>-aux/...``, so one run reports
        validation with and without experience side by side."""
        metrics = self._validate()
        exp = self.experience.exp if self.experience is not None else None
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
            if self.experience is not None and self.experience.exp.init_exp_only:
                self._build_memory_only()
                finished = True
                return
            if self.experience is not None and self.experience.exp.init_exp_before_training and self.global_steps == 0:
                self.experience.initial_summary(
                    rollout_inputs.initial_rollouts(self, self.experience.exp.init_exp_max_tasks))
            SkipManager.init(self.config)
            if self.config.trainer.get("val_before_train", True):
                val_metrics = self.validations(final=self.total_training_steps == 0)
                tracking.log(data=val_metrics, step=self.global_steps)
                if self.config.trainer.get("val_only", False):
                    finished = True
                    return
            self._train(tracking)
            finished = True
        finally:
            if self.experience is not None:
                self.experience.close(wait=finished)  # a failed or interrupted run does not wait on summaries
            self.adca.close()
            if finished:  # verl writes the validation dump (trainer.validation_data_dir) in a thread: let it end
                self._shutdown_dump_executor()

    def _train(self, tracking: Any) -> None:
        if self.staleness_bound is not None:
            self._train_async(tracking, self.staleness_bound)
            return
        from verl.utils.skip.skip_manager import SkipManager

        # the epoch a resumed run is in: the steps done so far over the batches per epoch (verl's rule)
        start_epoch = self.global_steps // max(len(self.train_dataloader), 1)
        progress = self._progress_bar()
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

    def _task_batches(self, start_epoch: int) -> Iterator[TaskBatch]:
        """The task rows of the steps still to train, in order, each with the loader's position after it."""
        step = self.global_steps
        for epoch in range(start_epoch, self.config.trainer.total_epochs):
            for rows in self.train_dataloader:
                step += 1
                yield TaskBatch(step=step, epoch=epoch, rows=rows, loader_state=self.train_dataloader.state_dict())
                if step >= self.total_training_steps:
                    return

    def _progress_bar(self) -> tqdm:
        """verl's "Training Progress" bar, off when the step table (``trainer.logger`` has ``table``) prints a
        row per step already: in the driver's process (``trainer.task_runner``) the bar's redraws would land
        between the table's rows, where Ray's line-by-line forwarding of an actor's output held them back."""
        from agentevolver.verl.tracking import logger_names

        table = "table" in logger_names(self.config.trainer.get("logger"))
        return tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress",
                    disable=table)

    def _train_async(self, tracking: Any, bound: int) -> None:
        """The loop of async training: later steps roll out in a thread while each step trains
        (:mod:`agentevolver.verl.async_loop`). The step's stages are :data:`STEP`'s, split at ``faults``."""
        from verl.utils.skip.skip_manager import SkipManager

        start_epoch = self.global_steps // max(len(self.train_dataloader), 1)
        progress = self._progress_bar()
        after_rollout = STEP[len(ROLLOUT_STAGES):]
        train_stages = tuple(stage for stage in after_rollout if stage.name not in (*PAUSED_STAGES, "metrics"))
        paused_stages = tuple(stage for stage in after_rollout if stage.name in PAUSED_STAGES)
        last = tuple(stage for stage in after_rollout if stage.name == "metrics")
        dataset_metrics = dict(getattr(self.train_dataset, "metrics", {}))
        ahead = RolloutAhead(
            self._task_batches(start_epoch),
            roll_out=lambda state: run_stages(ROLLOUT_STAGES, state, self),
            new_state=lambda task: StepState(step=task.step, epoch=task.epoch, task_rows=task.rows),
            version=self.global_steps, bound=bound)
        self.rollout_ahead = ahead.start()
        step_ended = time.perf_counter()
        try:
            while self.global_steps < self.total_training_steps:
                state, waited = ahead.next_step()
                self.global_steps = state.step
                SkipManager.set_step(state.step)
                if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                    self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
                # the loop's time per step: from the end of the step before (the rollout ran meanwhile)
                state.started = step_ended
                state.metrics["async/wait_rollout_s"] = waited
                record_staleness(state, bound)
                state = run_stages(train_stages, state, self)
                with ahead.paused() as waited_in_flight:
                    state.metrics["async/wait_rollout_s"] += waited_in_flight
                    state = run_stages(paused_stages, state, self)
                    ahead.weights_synced(state.step)
                state = run_stages(last, state, self)
                self.max_steps_duration = max(getattr(self, "max_steps_duration", 0.0), state.timings["step"])
                step_ended = time.perf_counter()
                tracking.log(data={**dataset_metrics, **state.metrics}, step=state.step)
                dataset_metrics = {}
                progress.update(1)
            if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
                self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=True)
        finally:
            ahead.stop()
            self.rollout_ahead = None
            progress.close()

    # ------------------------------------------------------------------ the step
    def train_step(self, rows: dict[str, Any], *, epoch: int = 0) -> dict[str, float]:
        """One training step on a batch of task rows: the stages of :data:`STEP`, in order; returns the step's
        metrics (module docstring)."""
        if hasattr(self.actor_rollout_wg, "async_calls_finalize_fn_exec"):
            self.actor_rollout_wg.async_calls_finalize_fn_exec(blocking=False)
        state = run_stages(STEP, StepState(step=self.global_steps, epoch=epoch, task_rows=rows), self)
        self.max_steps_duration = max(getattr(self, "max_steps_duration", 0.0), state.timings["step"])
        return state.metrics

    def _build_memory_only(self) -> None:
        """``init_exp_only``: build the memory from the training tasks and stop (no update, no checkpoint)."""
        assert self.experience is not None
        rollouts = rollout_inputs.initial_rollouts(self, self.experience.exp.init_exp_max_tasks)
        metrics = self.experience.initial_summary(rollouts)
        if metrics["exp/summary_stored"] == 0 and metrics["exp/summary_failed"] > 0:
            raise RuntimeError(
                f"init_exp_only: every summary request to the memory service at {self.experience.memory.base_url} "
                "failed, so no memory was built; see the warnings above (is the service up, and its "
                "exp_summarizer LLM?)")
        logger.info("init_exp_only: memory %r built (%d experiences stored); not training, as configured",
                    self.experience.workspace_id, int(metrics["exp/summary_stored"]))


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
    reason = sample_rows.refusal(
        multi_sample=settings.agent_flow.context_template != "linear",
        adv_estimator=estimator,
        use_critic=use_critic,
        distillation=bool((config.get("distillation") or {}).get("enabled", False)),
    )
    if reason:
        raise ConfigError(reason)
    AdcaStage(config, 1, settings=settings)  # its checks (estimator) run in the constructor; no client is built
    check_shared_prompts(config)
