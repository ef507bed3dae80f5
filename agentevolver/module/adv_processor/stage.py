"""The trainer's advantage stage for Self-Attributing: label steps, then overwrite GRPO's advantages.

The trainer's step runs it as two stages (``agentevolver.verl.step.trainer``): ``judge`` (:meth:`AdcaStage.label`)
right before ``adv``, whose ADCA part is :meth:`AdcaStage.advantages`, on top of the GRPO advantages verl's
estimator ``adca_grpo`` computes. When ADCA is on (``algorithm.adv_estimator=adca_grpo``; the old switch
``attribution_driven_credit_assignment.enable=true`` with ``grpo`` still works) and the step is within
``adca_grpo.prm_steps``, it

1. builds one judge input per sample (step count from the step ids, outcome = summed
   ``token_level_rewards``, GRPO advantage, the transcript from ``episode_record``),
2. gets the labels from ``judge.source``: ``llm`` asks the judge LLM (:func:`~.judge.evaluate_step_flags`);
   ``env`` asks the environment service (:func:`~.env_labels.env_step_flags`: ``POST /step_labels`` with each
   sample's ``env_type``, ``task_id`` and recorded messages), with no LLM call at all,
3. computes ADCA-GRPO advantages (:func:`~.adca_grpo.compute_prm_grpo_advantages`) with this step's alpha,
4. writes them over ``batch.batch["advantages"]`` (and ``returns``, which GRPO sets equal to them), puts each
   sample's labels in ``batch.non_tensor_batch["step_flags"]`` (a list of bools, True = GOOD; None where the
   sample kept its GRPO advantage) and returns ``adca/*`` metrics.

Otherwise it changes nothing and calls no judge.

Agreement (one rule): with ``source: llm`` and ``judge.compare_with_env`` true, or ``auto`` where the
environment offers step labels, the samples the LLM judged are also labelled by the environment and
``adca/judge_env_agreement`` (share of steps where the two agree) is logged with ``adca/judge_env/*`` and
``adca/env/*`` counts; the LLM's labels are still the ones trained on. With ``source: env`` there is no LLM
label to compare.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from omegaconf import DictConfig

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClient, client_for_role
from agentevolver.config import AgentEvolverSettings
from agentevolver.config.estimators import ADCA_ESTIMATOR, in_family
from agentevolver.errors import ConfigError
from agentevolver.module.adv_processor.adca_grpo import (
    AdcaHyper,
    compute_prm_grpo_advantages,
    cosine_alpha,
    grpo_outcome_scalar,
    num_steps,
    outcome_scores,
    step_ids_tensor,
)
from agentevolver.module.adv_processor.env_labels import (
    EnvLabelsResult,
    EnvStepLabeller,
    agreement_metrics,
    env_step_flags,
)
from agentevolver.module.adv_processor.judge import JudgeInput, StepFlagsResult, evaluate_step_flags
from agentevolver.module.adv_processor.judge_prompt import outcome_success, transcript_from_record

__all__ = ["ADCA_ESTIMATOR", "JUDGE_ROLE", "AdcaStage", "StepLabels", "adca_on", "episode_records", "judge_inputs"]

logger = logging.getLogger(__name__)

#: The LLM role (``llm.roles.<role>``) that labels steps.
JUDGE_ROLE = "judge"


def adca_on(adv_estimator: object, enable: object) -> bool:
    """Whether a run uses ADCA: its switch, ``algorithm.adv_estimator=adca_grpo``, or the old one,
    ``attribution_driven_credit_assignment.enable=true`` (every reader of the switch asks here)."""
    return str(adv_estimator) == ADCA_ESTIMATOR or bool(enable)

T = TypeVar("T")


@dataclass
class StepLabels:
    """The judge stage's output: per sample a list of step flags (True = GOOD), None where the sample keeps
    its GRPO advantage; and the ``adca/*`` numbers of getting them."""

    flags: list[list[bool] | None]
    metrics: dict[str, float] = field(default_factory=dict)


class AdcaStage:
    """See the module docstring. ``total_training_steps`` is the length of the alpha decay when
    ``adca_grpo.total_steps`` is null. ``judge_client`` replaces the client built from ``llm.roles.judge``
    (tests, or a trainer that shares clients between roles); ``env_client`` the environment client built
    from the ``env_service`` section (used for ``judge.source: env`` and ``compare_with_env``; neither client
    is built before it is needed); ``settings`` are the run's validated sections (validated once by the entry
    point; the trainer passes them)."""

    def __init__(self, config: DictConfig, total_training_steps: int, *, settings: AgentEvolverSettings,
                 judge_client: LLMClient | None = None, env_client: EnvClient | None = None):
        section = settings.attribution_driven_credit_assignment
        algorithm = config.get("algorithm") or {}
        estimator = str(algorithm.get("adv_estimator", "grpo"))
        # The switch is the estimator; the old one (enable=true with plain GRPO) still works (main_ppo says so).
        self.enabled = adca_on(estimator, section.enable)
        self.judge_settings = section.judge
        self.grpo = section.adca_grpo
        self.decay_steps = self.grpo.total_steps or max(int(total_training_steps), 1)
        self.norm_adv_by_std = bool(algorithm.get("norm_adv_by_std_in_grpo", True))
        if self.enabled and not in_family(estimator, "grpo"):
            raise ConfigError(
                f"attribution_driven_credit_assignment.enable=true needs GRPO advantages (ADCA's outcome part and "
                f"fallback); got algorithm.adv_estimator={estimator!r}: set algorithm.adv_estimator={ADCA_ESTIMATOR} "
                "(ADCA-GRPO; the one switch) or disable ADCA")
        self._client = judge_client
        self._owns_client = judge_client is None
        self._llm = settings.llm
        self.source = self.judge_settings.source
        self.compare_with_env = self.judge_settings.compare_with_env
        self.env_labeller = EnvStepLabeller(settings.env_service, env_client,
                                            label_synthetic_tasks=self.judge_settings.label_synthetic_tasks)

    # ------------------------------------------------------------------ schedule
    def active(self, step: int) -> bool:
        """Whether step ``step`` (verl's 1-based ``global_steps``) labels steps: enabled and within prm_steps."""
        return self.enabled and (self.grpo.prm_steps is None or step <= self.grpo.prm_steps)

    def alpha(self, step: int) -> float:
        """This step's alpha: ``adca_grpo.alpha``, or its cosine decay to ``alpha_min``."""
        if not self.grpo.alpha_cosine_decay_enable:
            return self.grpo.alpha
        return cosine_alpha(self.grpo.alpha, self.grpo.alpha_min, step, self.decay_steps)

    def hyper(self, step: int) -> AdcaHyper:
        grpo = self.grpo
        return AdcaHyper(
            prm_scheme=grpo.prm_scheme,
            equal_trajectory_weight=grpo.equal_trajectory_weight,
            fix_base=grpo.fix_base,
            alpha=self.alpha(step),
            orm_distribution=grpo.orm_distribution,
            enable_length_normalization=grpo.enable_length_normalization,
            allocation_inconsistent_weight=grpo.allocation_inconsistent_weight,
            norm_adv_by_std=self.norm_adv_by_std,
        )

    @property
    def client(self) -> LLMClient:
        """The judge's client (built on first use, so a disabled stage never needs the endpoint)."""
        if self._client is None:
            self._client = client_for_role(self._llm, JUDGE_ROLE)
        return self._client

    # ------------------------------------------------------------------ the stage
    def label(self, batch: Any, step: int) -> StepLabels | None:
        """The ``judge`` stage: every sample's step labels when active (None otherwise; no judge is called).

        Runs before the advantage stage, so the GRPO advantage that the skip rule reads is computed here from
        the outcomes and groups (:func:`~.adca_grpo.grpo_outcome_scalar`) when the batch has none yet.
        """
        if not self.active(step):
            return None
        started = time.perf_counter()
        inputs = judge_inputs(batch, self.judge_settings.max_message_chars, norm_adv_by_std=self.norm_adv_by_std)
        records = episode_records(batch)
        if self.source == "env":
            from_env = self._env_labels(inputs, records)
            flags, label_metrics = from_env.flags, from_env.metrics()
        else:
            labels: StepFlagsResult = run_coroutine(evaluate_step_flags(
                inputs, self.client, skip_type=self.grpo.skip_type,
                small_adv_threshold=self.grpo.skip_small_adv_threshold,
                parse_retries=self.judge_settings.parse_retries))
            flags, label_metrics = labels.flags, {**labels.metrics(), **self._agreement(labels, inputs, records)}
        return StepLabels(flags=flags, metrics={**label_metrics, "adca/time_s": time.perf_counter() - started})

    def advantages(self, batch: Any, labels: StepLabels | None, step: int) -> dict[str, float]:
        """The ADCA part of the advantage stage: overwrite ``batch``'s GRPO advantages (the outcome part and
        the fallback of unlabelled samples) with ADCA-GRPO's from ``labels``; returns ``adca/*`` metrics."""
        if labels is None:
            return {"adca/active": 0.0} if self.enabled else {}
        flags = labels.flags
        hyper = self.hyper(step)
        result = compute_prm_grpo_advantages(batch, flags, hyper)
        old = batch.batch.get("advantages", None)
        advantages = result.advantages.to(dtype=old.dtype if old is not None else torch.float32)
        batch.batch["advantages"] = advantages
        if "returns" in batch.batch:
            batch.batch["returns"] = advantages.clone()
        stored = np.empty(len(flags), dtype=object)
        stored[:] = [list(sample) if sample is not None else None for sample in flags]
        batch.non_tensor_batch["step_flags"] = stored
        # Each labelled episode's per-step advantages, so its earlier samples (multi-sample context managers)
        # get the same step credit through their own step ids (agentevolver.verl.step.sample_rows).
        steps = num_steps(step_ids_tensor(batch)).tolist()
        table = result.step_advantages.to(torch.float32)
        per_step = np.empty(len(flags), dtype=object)
        per_step[:] = [table[i, : steps[i]].tolist() if bool(result.labelled[i]) else None
                       for i in range(len(flags))]
        batch.non_tensor_batch["step_advantages"] = per_step
        return {"adca/active": 1.0, "adca/alpha": hyper.alpha, **labels.metrics, **result.metrics}

    def apply(self, batch: Any, step: int) -> dict[str, float]:
        """:meth:`label` then :meth:`advantages` on a batch that already has GRPO advantages (one call)."""
        return self.advantages(batch, self.label(batch, step), step)

    def _offered(self, records: list[dict[str, Any] | None], *, warn: bool) -> dict[str, bool | None]:
        """Which of the batch's environments offer step labels; ``warn`` about those that do not."""
        env_types = sorted({str(r["env_type"]) for r in records if r is not None and r.get("env_type")})
        offered = self.env_labeller.offers_labels(env_types)
        for env, capable in offered.items():
            if warn and capable is not True:
                why = "does not offer step labels" if capable is False else "could not be asked for step labels"
                self.env_labeller.warn_once(
                    f"offered:{env}", "ADCA (judge.source=%s, compare_with_env=%s): environment %r %s; its samples "
                    "get none (counted in adca/env/*)", self.source, self.compare_with_env, env, why)
        return offered

    def _env_labels(self, inputs: list[JudgeInput], records: list[dict[str, Any] | None]) -> EnvLabelsResult:
        """``source: env``: every sample's labels from the environment service; no LLM call."""
        offered = self._offered(records, warn=True)
        return run_coroutine(env_step_flags(inputs, records, self.env_labeller, offered,
                                            skip_type=self.grpo.skip_type,
                                            small_adv_threshold=self.grpo.skip_small_adv_threshold))

    def _agreement(self, labels: StepFlagsResult, inputs: list[JudgeInput],
                   records: list[dict[str, Any] | None]) -> dict[str, float]:
        """``source: llm``: the environment's labels of the judged samples and the judge's agreement with them,
        when ``compare_with_env`` asks for it (module docstring); {} otherwise."""
        if self.compare_with_env is False or "judged" not in labels.status:
            return {}
        offered = self._offered(records, warn=self.compare_with_env is True)
        if self.compare_with_env == "auto" and not any(offered.values()):
            return {}
        wanted = [status == "judged" for status in labels.status]
        env = run_coroutine(self.env_labeller.fetch(records, [item.num_steps for item in inputs], wanted, offered))
        return {**env.metrics(), **agreement_metrics(labels.flags, env)}

    def close(self) -> None:
        """Close the judge's and the environment client's connection pools (only clients this stage built)."""
        if self._owns_client and self._client is not None:
            self._client.close()
        self.env_labeller.close()


def episode_records(batch: Any) -> list[dict[str, Any] | None]:
    """Each sample's ``episode_record`` (docs/rollout_dumps.md), None where the batch has none."""
    records = batch.non_tensor_batch.get("episode_record")
    if records is None:
        return [None] * len(batch)
    return [record if isinstance(record, dict) else None for record in records]


def judge_inputs(batch: Any, max_message_chars: int, *, norm_adv_by_std: bool = True) -> list[JudgeInput]:
    """One :class:`JudgeInput` per sample of a verl ``DataProto`` (see the module docstring). The GRPO
    advantage is read from the batch's ``advantages`` when it has them, else computed from the outcomes."""
    steps = num_steps(step_ids_tensor(batch)).tolist()
    outcomes = outcome_scores(batch).tolist()
    if "advantages" in batch.batch:
        mask = batch.batch["response_mask"].to(torch.float32)
        grpo = ((batch.batch["advantages"].to(torch.float32) * mask).sum(-1) / mask.sum(-1).clamp_min(1)).tolist()
    elif "uid" in batch.non_tensor_batch:
        grpo = grpo_outcome_scalar(batch, norm_adv_by_std=norm_adv_by_std).tolist()
    else:
        grpo = [0.0] * len(steps)
    records = batch.non_tensor_batch.get("episode_record")
    inputs = []
    for index, (count, outcome, advantage) in enumerate(zip(steps, outcomes, grpo, strict=True)):
        record = records[index] if records is not None else None
        transcript = transcript_from_record(record, count, max_message_chars) if record is not None else None
        inputs.append(JudgeInput(num_steps=count, outcome=outcome, grpo_advantage=advantage,
                                 success=outcome_success(record, outcome), transcript=transcript))
    return inputs


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion from synchronous code, even when this thread already runs a loop.

    The trainer's step is synchronous; if it ever runs inside an event loop (an async Ray actor), a fresh
    loop in a worker thread keeps the judge from being scheduled onto, and blocking, that loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
