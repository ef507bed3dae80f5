"""The trainer's side of Self-Navigating: plan who gets experience, build and update the memory, count it.

One :class:`ExperienceManager` per run, in the trainer (driver) process. Per rollout batch it draws the
experience plan (:mod:`.allocation`) and writes it into the rows the agent loop reads, under the names of the
:class:`~agentevolver.module.agent_flow.episode.EpisodeSpec` fields they become (``add_experience``: retrieve
experience for this episode; ``train_mode``: ``keep`` or ``discard`` it for training). The agent flow
does the rest per episode (:mod:`.retriever`, then the context manager strips discarded experience by
re-rendering the prompt). After each update it submits the step's episodes for summarisation every
``memory.updated_freq`` steps (:mod:`.summarizer`, in the background) and reports what happened as
``exp/*`` metrics. ``exp_manager.experience_kind`` says whether those summaries distil advice (the service's
LLM) or store each task's best solved episode as an exemplar (no LLM; docs/self_navigating.md).

The six usage modes of seed 002 (``config/exp_mode/``) are combinations of these switches:

=====================  ============  ======================  =============  ==========  ===========
mode                   updated_freq  init_exp_before_train.  init_exp_only  summarizer  ctx. gen.
=====================  ============  ======================  =============  ==========  ===========
no_pool                0             false                   false          false       false
init_only              0             true                    true           true        false
init_train             0             true                    false          false       true
init_train_update      k > 0         true                    false          true        true
exist_train            0             false                   false          false       true
exist_train_update     k > 0         false                   false          true        true
=====================  ============  ======================  =============  ==========  ===========
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from agentevolver.client.http import ServiceClientError
from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings
from agentevolver.config.schema import AgentEvolverSettings, ExpManagerSection, MemorySection, RolloutMode
from agentevolver.errors import ConfigError
from agentevolver.module.exp_manager.allocation import ExperiencePlan, plan_rows, seeded_rng
from agentevolver.module.exp_manager.summarizer import BackgroundSummarizer, trajectories_from_records

__all__ = ["ADD_COLUMN", "PLAN_COLUMNS", "TRAIN_MODE_COLUMN", "ExperienceManager", "check_settings", "compare_key",
           "draw_plan"]

logger = logging.getLogger(__name__)

#: Row columns the agent loop reads (:func:`agentevolver.verl.agent_loop.episode_spec_from_row`): one name and
#: one type from the plan to the episode, the EpisodeSpec field each becomes.
ADD_COLUMN = "add_experience"
TRAIN_MODE_COLUMN = "train_mode"
PLAN_COLUMNS = (ADD_COLUMN, TRAIN_MODE_COLUMN)


def compare_key(key: str, mode: str) -> str:
    """The name a metric of ``val_compare_mode``'s second validation pass is logged under: verl's ``val-core/...``
    and ``val-aux/...`` become ``val-exp_<mode>-core/...`` and ``val-exp_<mode>-aux/...`` (other keys get the
    prefix whole), so the regular pass's keys, which reports and curves read, keep their meaning."""
    if key.startswith("val-"):
        return f"val-exp_{mode}-{key[len('val-'):]}"
    return f"val-exp_{mode}/{key}"


def check_settings(exp: ExpManagerSection, memory: MemorySection, loss_mode: str) -> list[str]:
    """Raise for switch combinations that cannot work; return warnings for ones that likely do not do what
    the user wants."""
    if exp.init_exp_only and not exp.init_exp_before_training:
        raise ConfigError("exp_manager.init_exp_only is true but exp_manager.init_exp_before_training is false: "
                          "there would be nothing to do; set init_exp_before_training=true (or use "
                          "exp_mode=init_only)")
    if exp.val_compare_mode is not None and not memory.enable_context_generator:
        raise ConfigError(f"exp_manager.val_compare_mode={exp.val_compare_mode} but memory.enable_context_generator "
                          "is false: no experience is retrieved, so the second validation would equal the first; "
                          "turn the context generator on (e.g. exp_mode=exist_train) or set val_compare_mode=null")
    warnings = []
    if memory.updated_freq > 0 and not memory.enable_summarizer:
        warnings.append(f"memory.updated_freq={memory.updated_freq} but memory.enable_summarizer is false: the "
                        "memory is never updated during training; set enable_summarizer=true")
    if memory.enable_context_generator and exp.train_rollout_mode == "woexp" and exp.val_rollout_mode == "woexp":
        warnings.append("memory.enable_context_generator is true but exp_manager.train_rollout_mode and "
                        "val_rollout_mode are woexp: no episode gets experience; use mixed or all")
    elif (exp.train_rollout_mode != "woexp") and not memory.enable_context_generator:
        warnings.append(f"exp_manager.train_rollout_mode={exp.train_rollout_mode} but "
                        "memory.enable_context_generator is false: no experience is retrieved")
    strips = memory.enable_context_generator and exp.train_rollout_mode != "woexp" and (
        exp.train_sample_mode == "alldiscard" or (exp.train_sample_mode == "hybrid" and exp.train_sample_keepratio < 1))
    if strips and loss_mode != "exp_on_off":
        warnings.append("experience is stripped from some trained samples but "
                        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: their tokens are trained "
                        "with the on-policy clip; set loss_mode=exp_on_off to use exp_manager.off_cliprange_high")
    return warnings


def draw_plan(exp: ExpManagerSection, uids: list[str], *, validate: bool, step: int,
              rollout_mode: RolloutMode | None = None) -> ExperiencePlan:
    """The experience plan of one batch of rows grouped by ``uids``: training draws from the train modes,
    validation (and rollout-only jobs) from ``val_rollout_mode`` (or ``rollout_mode``: the second pass of
    ``val_compare_mode``) and never strips (nothing is trained)."""
    default_mode = exp.val_rollout_mode if validate else exp.train_rollout_mode
    return plan_rows(
        uids,
        rollout_mode=rollout_mode or default_mode,
        rollout_ratio=exp.rollout_ratio,
        sample_mode="allkeep" if validate else exp.train_sample_mode,
        keep_ratio=exp.train_sample_keepratio,
        rng=seeded_rng(exp.seed, "val" if validate else "train", step),
    )


class ExperienceManager:
    """Plans experience per batch and keeps the memory up to date (see the module docstring)."""

    def __init__(self, exp: ExpManagerSection, memory: MemorySection, client: MemoryClient | None = None) -> None:
        self.exp = exp
        self.memory = memory
        self.client = client or MemoryClient(MemoryClientSettings.from_config(memory.model_dump(mode="json")))
        self._summarizer: BackgroundSummarizer | None = None
        self._carry: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: Any, settings: AgentEvolverSettings) -> ExperienceManager:
        """From the run's config (verl's loss mode) and its validated sections (the entry point validates them)."""
        for warning in check_settings(settings.exp_manager, settings.memory,
                                      str(config.actor_rollout_ref.actor.policy_loss.loss_mode)):
            logger.warning("Self-Navigating: %s", warning)
        return cls(settings.exp_manager, settings.memory)

    # ------------------------------------------------------------------ switches
    @property
    def workspace_id(self) -> str:
        return self.memory.workspace_id

    @property
    def active(self) -> bool:
        """Anything to do at all (the ``no_pool`` mode is inactive: rows and metrics stay as without it)."""
        return bool(self.memory.enable_context_generator or self.memory.enable_summarizer
                    or self.exp.init_exp_before_training)

    def summaries_due(self, step: int) -> bool:
        """Whether the episodes of training step ``step`` are summarised into the memory."""
        return bool(self.memory.enable_summarizer and self.memory.updated_freq
                    and step % self.memory.updated_freq == 0)

    @property
    def summarizer(self) -> BackgroundSummarizer:
        if self._summarizer is None:
            self._summarizer = BackgroundSummarizer(self.client, self.workspace_id, self.exp.summary_batch_size,
                                                    kind=self.exp.experience_kind)
        return self._summarizer

    # ------------------------------------------------------------------ start-up
    def check_memory(self) -> None:
        """Say early whether the memory service answers and holds experience for this run.

        A service that is down is a warning (training runs without experience until it answers); a
        workspace that is empty while nothing would ever fill it (``exist_train``) is a configuration error.
        """
        if not self.active:
            return
        try:
            count = self.client.workspaces().get(self.workspace_id, 0)
        except (ServiceClientError, OSError, KeyError) as err:
            logger.warning("Self-Navigating: the memory service at %s does not answer (%s); episodes run without "
                           "experience and summaries fail (counted in exp/* metrics) until it does",
                           self.memory.base_url, err)
            return
        fills = self.exp.init_exp_before_training or (self.memory.enable_summarizer and self.memory.updated_freq)
        if self.memory.enable_context_generator and count == 0 and not fills:
            raise ConfigError(
                f"memory.workspace_id: workspace {self.workspace_id!r} at {self.memory.base_url} holds no experience "
                "and nothing in this run adds any (init_exp_before_training false, no summarizer updates); point "
                "memory.workspace_id at an existing workspace, import one (POST /workspaces/<id>/import), or use "
                "exp_mode=init_train")
        logger.info("Self-Navigating: workspace %r holds %d experiences", self.workspace_id, count)

    # ------------------------------------------------------------------ per batch
    def plan(self, batch: Any, *, validate: bool, step: int,
             rollout_mode: RolloutMode | None = None) -> dict[str, float]:
        """Write the experience plan into ``batch``'s rows (a verl ``DataProto`` repeated ``n`` per task);
        ``rollout_mode`` overrides the configured mode (the second validation pass of ``val_compare_mode``)."""
        if not self.memory.enable_context_generator:
            return {}
        uids = batch.non_tensor_batch.get("uid")
        if uids is None:
            uids = np.array([str(i) for i in range(len(batch))], dtype=object)
        plan = draw_plan(self.exp, list(uids), validate=validate, step=step, rollout_mode=rollout_mode)
        batch.non_tensor_batch[ADD_COLUMN] = np.array(plan.add_experience, dtype=object)
        batch.non_tensor_batch[TRAIN_MODE_COLUMN] = np.array(plan.train_mode, dtype=object)
        return {"exp/planned_share": plan.guided / max(len(uids), 1)}

    def after_step(self, batch: Any, step: int) -> dict[str, float]:
        """After the update of training step ``step``: queue summaries if due, collect finished ones."""
        metrics = dict(self._carry)
        self._carry = {}
        if self.summaries_due(step):
            trajectories = self.trajectories(batch)
            if trajectories:
                metrics["exp/summary_submitted"] = float(self.summarizer.submit(trajectories))
        if self._summarizer is not None:
            metrics.update(self._summarizer.drain())
        return metrics

    def trajectories(self, batch: Any) -> list[dict[str, Any]]:
        """The batch's episodes as summary trajectories, in the form ``exp_manager.experience_kind`` needs."""
        records = batch.non_tensor_batch.get("episode_record")
        scores = batch.non_tensor_batch.get("reward_outcome")
        if records is None or scores is None:
            return []
        return trajectories_from_records(list(records), [float(s) for s in scores], kind=self.exp.experience_kind)

    # ------------------------------------------------------------------ before training
    def initial_summary(self, rollouts: Iterable[Any]) -> dict[str, float]:
        """``init_exp_before_training``: summarise every episode of ``rollouts`` (batches of the training tasks
        rolled out once without experience, :func:`agentevolver.verl.rollout_manager.initial_rollouts`) and wait
        for the memory to be written, so the first step can retrieve from it."""
        started = time.perf_counter()
        cleared = self.clear_workspace() if self.exp.init_exp_clear_workspace else 0
        episodes = 0
        for output in rollouts:
            trajectories = self.trajectories(output)
            episodes += len(output)
            if trajectories:
                self.summarizer.submit(trajectories)
        metrics = self.summarizer.wait()
        metrics["exp/init_episodes"] = float(episodes)
        metrics["exp/init_cleared"] = float(cleared)
        metrics["exp/init_s"] = time.perf_counter() - started
        logger.info("Self-Navigating: initial memory built in %.0f s: %d experiences stored, %d requests failed",
                    metrics["exp/init_s"], int(metrics["exp/summary_stored"]), int(metrics["exp/summary_failed"]))
        self._carry.update({k: v for k, v in metrics.items() if k.startswith("exp/init")
                            or k.endswith("_total")})
        return metrics

    def clear_workspace(self) -> int:
        """``init_exp_clear_workspace``: delete what the workspace holds before the initial memory is built;
        returns how many experiences were deleted. A service that does not answer is a warning: the initial
        summaries will count their own failures."""
        try:
            count = int((self.client.delete_workspace(self.workspace_id) or {}).get("deleted", 0))
        except (ServiceClientError, OSError) as err:
            logger.warning("Self-Navigating: could not clear workspace %r at %s before the initial memory (%s)",
                           self.workspace_id, self.memory.base_url, err)
            return 0
        if count:
            logger.warning("Self-Navigating: deleted %d experiences left in workspace %r by an earlier run, so this "
                           "run starts from its own initial memory (exp_manager.init_exp_clear_workspace=false keeps "
                           "them)", count, self.workspace_id)
        return count

    def close(self, wait: bool = True) -> None:
        """At the end of the run: let queued summaries finish (the last steps' episodes belong in the memory
        too; each request is bounded by ``memory.timeout_s``), then report the run's totals. A run that is
        failing or interrupted passes ``wait=False`` and abandons them instead of delaying its exit."""
        if self._summarizer is not None:
            if wait:
                self._summarizer.wait()
            totals = self._summarizer.totals
            logger.info("Self-Navigating: %d summary requests (%d trajectories), %d failed, %d experiences stored "
                        "in workspace %r", totals["submitted"], totals["trajectories"], totals["failed"],
                        totals["stored"], self.workspace_id)
            self._summarizer.close(wait_for_pending=False)
        self.client.close()
