"""The agent flow as a verl agent loop, so verl's ``AgentLoopManager`` drives our episodes.

Registered as ``agentevolver`` in ``verl.experimental.agent_loop``: set
``actor_rollout_ref.rollout.agent.default_agent_loop=agentevolver`` (or an ``agent_name`` column). verl
builds one loop object per sample and calls ``run(sampling_params, **row)``; generation then goes through
verl's server manager (vLLM replicas on GPU, the CPU rollout server on CPU) with one request id per episode.

The dataset row carries the task manager's :class:`~agentevolver.schema.TaskObjective` under ``task`` and
the environment's ``/create`` parameters under ``env_params``
(:class:`~agentevolver.verl.task_dataset.TaskDataset`); the group id comes from verl's ``uid`` column, so the
``rollout.n`` copies of a row form one GRPO group, and the experience plan's columns ride along. The output is the episode's final sample; everything else the trainer needs
(step_ids, termination, reward parts, exp_mask, metrics, the dump record, and the earlier samples of
multi-sample context managers, which the trainer turns into rows of their own:
:mod:`agentevolver.verl.step.sample_rows`) travels in ``extra_fields``.

Per worker process, one :class:`WorkerContext` holds what the episodes share: the validated settings, the env
client's connection pool, the episode source (the agent flow, or the agent program through the gateway:
:mod:`agentevolver.module.agent_flow.sources`, a registry the gateway registers itself into) and the
synthetic tasks' grader pool. verl creates a loop object per *sample*; the context is built by the first and
reused by the rest while the worker's config, server manager and tokenizer are the same objects (they are,
for the worker's life), so the config is validated, the environment's tool schemas fetched and connection
pools opened once per process, not once per episode. Nothing in it holds per-episode state.

After the episode, :func:`compose_reward` is the one place its reward is finished: a synthetic task's grader,
then ``reward.custom_reward_function`` (the order :mod:`agentevolver.verl.custom_reward` documents).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentevolver.client.env_client import EnvClient
from agentevolver.config import AgentEvolverSettings, validate_config
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.agent_flow.sources import EpisodeSource, SourceParts, build_source
from agentevolver.module.exp_manager.manager import PLAN_COLUMNS
from agentevolver.module.task_manager.graders import GraderPool, agrade_episode
from agentevolver.schema import TaskObjective
from agentevolver.verl.custom_reward import apply_custom_reward

__all__ = ["AGENT_LOOP_NAME", "AgentEvolverAgentLoop", "WorkerContext", "compose_reward", "episode_spec_from_row",
           "flow_budgets", "retriever_for", "worker_context"]

logger = logging.getLogger(__name__)

#: The name to put in ``rollout.agent.default_agent_loop`` / the ``agent_name`` column.
AGENT_LOOP_NAME = "agentevolver"


class _FirstOnly(logging.Filter):
    """Lets a message through once per process: verl's agent-loop base class warns about its token builder
    for every *sample* (one loop object each), and this loop does not use that builder at all."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self.prefix):
            return True
        first, self.seen = not self.seen, True
        return first


logging.getLogger("verl.utils.tokenizer.continuous_token_wiring").addFilter(
    _FirstOnly("No model-specific Continuous Token builder"))


def flow_budgets(config: DictConfig) -> dict[str, int]:
    """Token budgets of an episode from verl's keys: prompt cap, response cap and their sum as the window."""
    prompt = int(config.data.max_prompt_length)
    response = int(config.actor_rollout_ref.rollout.response_length)
    return {"max_prompt_len": prompt, "max_response_len": response, "max_model_len": prompt + response}


def retriever_for(config: DictConfig) -> Any:
    """Self-Navigating's experience retriever when the run retrieves experience (memory.enable_context_generator)."""
    if not bool(config.memory.enable_context_generator):
        return None
    from agentevolver.module.exp_manager.retriever import ExperienceRetriever

    return ExperienceRetriever.from_config(config)


@dataclass(frozen=True)
class WorkerContext:
    """What every loop object of one worker process shares (module docstring), built from the config once.

    ``config``, ``server_manager`` and ``tokenizer`` are the objects it was built for (:meth:`serves`);
    ``settings`` are the run's sections, validated here: this process's entry point.
    """

    config: DictConfig
    server_manager: Any
    tokenizer: Any
    settings: AgentEvolverSettings
    env_client: EnvClient
    episodes: EpisodeSource
    graders: GraderPool
    response_length: int

    @classmethod
    def build(cls, config: DictConfig, server_manager: Any, tokenizer: Any) -> WorkerContext:
        settings = validate_config(config)
        env_client = EnvClient.from_config(settings.env_service)
        parts = SourceParts(settings=settings, tokenizer=tokenizer, generate=server_manager.generate,
                            env_client=env_client, budgets=flow_budgets(config), retriever=retriever_for(config))
        return cls(config=config, server_manager=server_manager, tokenizer=tokenizer, settings=settings,
                   env_client=env_client, episodes=build_source(parts),
                   graders=GraderPool.from_settings(settings),
                   response_length=int(config.actor_rollout_ref.rollout.response_length))

    def serves(self, config: DictConfig, server_manager: Any, tokenizer: Any) -> bool:
        """Whether this context was built for these very objects (identity, not equality)."""
        return self.config is config and self.server_manager is server_manager and self.tokenizer is tokenizer


_CONTEXT_LOCK = threading.Lock()
_CONTEXT: WorkerContext | None = None


def worker_context(config: DictConfig, server_manager: Any, tokenizer: Any) -> WorkerContext:
    """The process's :class:`WorkerContext`, built on first use and rebuilt only for other config, server
    manager or tokenizer objects (a test process that builds several loops; a worker never does)."""
    global _CONTEXT
    with _CONTEXT_LOCK:
        if _CONTEXT is None or not _CONTEXT.serves(config, server_manager, tokenizer):
            _CONTEXT = WorkerContext.build(config, server_manager, tokenizer)
        return _CONTEXT


async def compose_reward(result: EpisodeResult, spec: EpisodeSpec, row: Mapping[str, Any],
                         context: WorkerContext) -> EpisodeResult:
    """The episode's final reward on top of its source's score (env ``/evaluate`` or the program's): a task
    that names its own grader (e.g. a synthetic task) is re-scored by it, then the custom reward function
    (``reward.custom_reward_function``), if any, has the last word."""
    if spec.task is not None and spec.task.evaluator != "env":
        result = await agrade_episode(result, spec, context.graders)
    return await apply_custom_reward(result, spec, row, context.config, context.tokenizer)


def episode_spec_from_row(row: Mapping[str, Any]) -> EpisodeSpec:
    """The episode of one dataset row: its task objective, group, rollout and experience plan (see the module
    docstring); errors name the missing field."""
    objective = row.get("task")
    if not isinstance(objective, TaskObjective):
        raise ConfigError("agentevolver agent loop: each dataset row needs a 'task' field holding a TaskObjective "
                          "(agentevolver.verl.task_dataset.TaskDataset builds such rows); got "
                          f"{type(objective).__name__}")
    fields: dict[str, Any] = {}
    # Self-Navigating's plan (agentevolver.module.exp_manager.manager): columns named as the spec's fields.
    for column in PLAN_COLUMNS:
        if row.get(column) is not None:
            fields[column] = row[column].item() if hasattr(row[column], "item") else row[column]
    return EpisodeSpec.for_objective(
        objective, group_id=str(row.get("uid") or objective.task.task_id),
        rollout_id=int(row["rollout_id"]) if row.get("rollout_id") is not None else 0,
        env_params=row.get("env_params") or {}, **fields)


@register(AGENT_LOOP_NAME)
class AgentEvolverAgentLoop(AgentLoopBase):
    """verl agent loop running one episode per sample (its worker's :class:`WorkerContext` says how)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Shared by every loop object of the process; its episode source is the user's agent program through
        #: the gateway (``agent_program``) or the agent flow, both returning an EpisodeResult.
        self.context = worker_context(self.config, self.server_manager, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = episode_spec_from_row(kwargs)
        result = await self.context.episodes.run(spec, sampling_params)
        result = await compose_reward(result, spec, kwargs, self.context)
        return to_agent_loop_output(result, self.tokenizer, self.context.response_length)


def _sample_fields(sample: Any) -> dict[str, Any]:
    """The token fields of one sample that become a training row (plain lists: they cross Ray as objects)."""
    return {"prompt_ids": list(sample.prompt_ids), "response_ids": list(sample.response_ids),
            "response_mask": list(sample.response_mask), "step_ids": list(sample.step_ids),
            "response_logprobs": list(sample.response_logprobs) if sample.response_logprobs is not None else None,
            "exp_mask": bool(sample.exp_mask)}


def padded_step_ids(step_ids: list[int], width: int) -> np.ndarray:
    """Step ids as one ``int32`` row of the response's padded width (-1 beyond the response): built here, in
    the agent-loop worker while other episodes still run, so the trainer turns a step's rows into the (B, L)
    tensor ADCA reads with one ``np.stack`` instead of converting Python lists (bench/advantage.py)."""
    row = np.full(width, -1, dtype=np.int32)
    count = min(len(step_ids), width)
    row[:count] = step_ids[:count]
    return row


def to_agent_loop_output(result: EpisodeResult, tokenizer: Any, response_length: int | None = None) -> AgentLoopOutput:
    """verl's per-sample output: the final sample's tensors and the rest in ``extra_fields``.

    ``response_length`` (``rollout.response_length``) pads ``step_ids`` to the batch's response width
    (:func:`padded_step_ids`); without it they stay a list.

    An episode that failed before its first prompt (e.g. /create failed) still yields a well-formed sample,
    so the batch keeps its shape and verl's checks hold: a one-token prompt, an empty response and empty
    rollout log-probs (verl takes the batch's ``rollout_log_probs`` from the first episode's, so one episode
    without them used to drop them for all, and bypass mode then stopped the run), reward 0. ``failure``
    says which service failed; the trainer keeps such episodes out of the update.
    """
    sample = result.final_sample
    if sample is not None:
        prompt_ids, response_ids = sample.prompt_ids, sample.response_ids
        response_mask, logprobs, step_ids = sample.response_mask, sample.response_logprobs, sample.step_ids
    else:
        prompt_ids = [tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0]
        response_ids, response_mask, logprobs, step_ids = [], [], [], []
    record = result.to_dump_record(step=-1)
    extra = {
        "step_ids": padded_step_ids(step_ids, response_length) if response_length else step_ids,
        "termination": result.termination,
        # The service that failed ("" for a good episode): kept out of the update (agentevolver.verl.step.faults).
        "failure": result.failure or "",
        "task_id": result.task_id,
        "group_id": result.group_id,
        "reward_outcome": result.reward.outcome,
        "reward_success_rate": result.reward.success_rate,
        "reward_madness": result.reward.madness,
        "exp_mask": bool(sample.exp_mask) if sample is not None else False,
        # Earlier samples of a multi-sample context manager, trained as rows of their own
        # (agentevolver.verl.step.sample_rows); [] for a single-sample episode.
        "other_samples": [_sample_fields(other) for other in result.samples[:-1]],
        "episode_metrics": result.metrics,
        "episode_record": record,
        # verl turns these into validation metrics per data source: acc/mean@k (avg@k) and acc/best@k;
        # experience/mean@k is the share of validation episodes that ran with experience (Self-Navigating).
        # task_id (a string: verl's metrics skip it) names the task in verl's per-sample validation dump
        # (trainer.validation_data_dir), which the ablation report pairs task by task (agentevolver.experiments.records).
        # failed/mean@k is the share of validation episodes a service failure ended: verl scores them as failed
        # tasks, so the ablation report names every run whose validation had any (its score is not the model's).
        "reward_extra_info": {"acc": result.reward.success_rate, "outcome": result.reward.outcome,
                              "experience": float(result.metrics.get("exp/injected", 0.0)),
                              "failed": 0.0 if result.failure is None else 1.0,
                              "task_id": result.task_id},
    }
    return AgentLoopOutput(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=response_mask,
        response_logprobs=logprobs,
        reward_score=result.reward.outcome,
        num_turns=result.num_turns,
        metrics=AgentLoopMetrics(
            generate_sequences=result.metrics.get("time/generate_s", 0.0),
            tool_calls=result.metrics.get("time/tool_s", 0.0) + result.metrics.get("time/env_s", 0.0),
        ),
        extra_fields=extra,
    )
