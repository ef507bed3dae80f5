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

Process-wide objects (the env client's connection pool, the flow with its parsed config, parser, tool
catalogue, clipper client and cache of environment tool schemas) are cached per worker process, keyed by
the config they were built from: verl creates a loop object per *sample*, and rebuilding them per sample
would validate the config, fetch the environment's tool schemas and open connection pools once per
episode. They hold no per-episode state.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentevolver.client.env_client import EnvClient
from agentevolver.config.agent_flow import AgentFlowConfig
from agentevolver.config.agent_program import AgentProgramConfig
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.agent_flow.flow import AgentFlow, clipper_for
from agentevolver.module.exp_manager.manager import PLAN_COLUMNS
from agentevolver.module.task_manager.graders import GraderPool, agrade_episode
from agentevolver.schema import TaskObjective
from agentevolver.verl.custom_reward import apply_custom_reward

__all__ = ["AGENT_LOOP_NAME", "AgentEvolverAgentLoop", "episode_spec_from_row", "flow_budgets", "retriever_for"]

logger = logging.getLogger(__name__)

#: The name to put in ``rollout.agent.default_agent_loop`` / the ``agent_name`` column.
AGENT_LOOP_NAME = "agentevolver"

_CACHE_LOCK = threading.Lock()
_ENV_CLIENTS: dict[str, EnvClient] = {}
#: config key -> (server manager, tokenizer, flow); the first two are kept to check identity on reuse.
_FLOWS: dict[str, tuple[Any, Any, AgentFlow]] = {}
#: config key -> (server manager, tokenizer, agent-program episodes): one gateway per worker process.
_PROGRAMS: dict[str, tuple[Any, Any, Any]] = {}
#: Grader pools (synthetic tasks' LLM graders) per task_manager + llm config, one per worker process.
_GRADERS: dict[str, Any] = {}


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


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _shared_env_client(section: Any) -> EnvClient:
    """One env client (one connection pool) per worker process and env-service config."""
    key = json.dumps(_plain(section), sort_keys=True, default=str)
    with _CACHE_LOCK:
        client = _ENV_CLIENTS.get(key)
        if client is None:
            client = _ENV_CLIENTS[key] = EnvClient.from_config(section)
        return client


def _shared_flow(config: DictConfig, server_manager: Any, tokenizer: Any) -> AgentFlow:
    """One :class:`AgentFlow` per worker process, config, server manager and tokenizer."""
    sections = {name: _plain(config[name]) for name in ("agent_flow", "env_service", "llm", "memory", "exp_manager")}
    key = json.dumps({**sections, **flow_budgets(config)}, sort_keys=True, default=str)
    with _CACHE_LOCK:
        cached = _FLOWS.get(key)
        if cached is not None and cached[0] is server_manager and cached[1] is tokenizer:
            return cached[2]
    flow_config = AgentFlowConfig.model_validate(sections["agent_flow"])
    flow = AgentFlow(
        flow_config,
        tokenizer=tokenizer,
        env_client=_shared_env_client(config.env_service),
        generate=server_manager.generate,
        clipper=clipper_for(flow_config, config.llm),
        retriever=retriever_for(config),
        **flow_budgets(config),
    )
    with _CACHE_LOCK:
        _FLOWS[key] = (server_manager, tokenizer, flow)
    return flow


def _shared_program_episodes(config: DictConfig, server_manager: Any, tokenizer: Any) -> Any:
    """The agent-program episode source (:mod:`agentevolver.gateway`) when ``agent_program`` names a
    program, one per worker process (it serves the gateway); None = episodes run the agent flow."""
    section = _plain(config.get("agent_program")) or {}
    program_config = AgentProgramConfig.model_validate(section)
    if not program_config.enabled:
        return None
    sections = {name: _plain(config[name]) for name in ("agent_program", "agent_flow", "env_service", "memory",
                                                         "exp_manager")}
    key = json.dumps({**sections, **flow_budgets(config)}, sort_keys=True, default=str)
    with _CACHE_LOCK:
        cached = _PROGRAMS.get(key)
        if cached is not None and cached[0] is server_manager and cached[1] is tokenizer:
            return cached[2]
    from agentevolver.gateway.runner import ProgramEpisodes

    episodes = ProgramEpisodes(
        program_config, AgentFlowConfig.model_validate(sections["agent_flow"]), tokenizer=tokenizer,
        env_client=_shared_env_client(config.env_service), generate=server_manager.generate,
        retriever=retriever_for(config), **flow_budgets(config))
    with _CACHE_LOCK:
        _PROGRAMS[key] = (server_manager, tokenizer, episodes)
    return episodes


def retriever_for(config: DictConfig) -> Any:
    """Self-Navigating's experience retriever when the run retrieves experience (memory.enable_context_generator)."""
    if not bool(config.memory.enable_context_generator):
        return None
    from agentevolver.module.exp_manager.retriever import ExperienceRetriever

    return ExperienceRetriever.from_config(config)


def _shared_grader_pool(config: DictConfig) -> Any:
    """One grader pool per worker process and config: synthetic tasks name an LLM grader, and its client
    (connection pool, concurrency limit) is shared by every episode of the process."""
    key = json.dumps({name: _plain(config[name]) for name in ("task_manager", "llm")}, sort_keys=True, default=str)
    with _CACHE_LOCK:
        pool = _GRADERS.get(key)
        if pool is None:
            pool = _GRADERS[key] = GraderPool.from_config(config)
        return pool


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
    """verl agent loop running one :class:`AgentFlow` episode per sample."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Where episodes come from: the user's agent program through the gateway (``agent_program``), or
        #: the agent flow. Both return an EpisodeResult, so everything after the episode is the same.
        self.episodes = _shared_program_episodes(self.config, self.server_manager, self.tokenizer) or _shared_flow(
            self.config, self.server_manager, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = episode_spec_from_row(kwargs)
        result = await self.episodes.run(spec, sampling_params)
        if spec.task is not None and spec.task.evaluator != "env":  # e.g. a synthetic task: its own grader scores it
            result = await agrade_episode(result, spec, _shared_grader_pool(self.config))
        result = await apply_custom_reward(result, spec, kwargs, self.config, self.tokenizer)  # reward.custom_reward_function
        return to_agent_loop_output(result, self.tokenizer, int(self.config.actor_rollout_ref.rollout.response_length))


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
        "reward_extra_info": {"acc": result.reward.success_rate, "outcome": result.reward.outcome,
                              "experience": float(result.metrics.get("exp/injected", 0.0))},
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
