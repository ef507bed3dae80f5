"""Agent-program episodes: the episode source used instead of the agent flow when ``agent_program`` is set.

One episode::

    /create (the task's opening messages and tools; the environment is the task source, as for the flow)
    [Self-Navigating: retrieve the task's experience; the gateway injects it into the program's first call]
    open the episode on the gateway -> run the program with its ProgramTask (time limit) -> close it
    reward: the program's (its return value or POST .../reward), or the environment's (agent_program.reward:
            env: the program's answer is stepped into the instance and /evaluate scores it)
    /release (always)

The result is an :class:`~agentevolver.module.agent_flow.episode.EpisodeResult`, like an agent-flow
episode's, so the agent loop, the synthetic tasks' graders, the dumps and the trainer treat both alike.

Faults fail the episode alone (``failure`` ``program``; the trainer keeps it out of the update and counts
it in ``episode/failed/program``): a program that raised, ran past ``agent_program.timeout_s``, gave a
reward that is not a finite number, or made no call. A program that stops because the gateway refused a
call for a full context or too many calls ended like an agent-flow episode at its budget (``budget`` /
``max_steps``): it is trained, with reward 0 unless the environment scores its last reply.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from typing import Any

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.config.agent_flow import AgentFlowConfig
from agentevolver.config.agent_program import AgentProgramConfig
from agentevolver.gateway.app import GatewayServer
from agentevolver.gateway.calls import new_episode_id
from agentevolver.gateway.episodes import Gateway, GatewayEpisode
from agentevolver.gateway.program import AgentProgram, ProgramRun
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec, Termination
from agentevolver.module.agent_flow.flow import GenerateFn, initial_messages
from agentevolver.module.agent_flow.plugins import check_plugin_names, context_config
from agentevolver.module.exp_manager.retriever import in_policy_dialect
from agentevolver.module.tools.config import make_parser
from agentevolver.schema.gateway_wire import ProgramTask
from agentevolver.schema.message import ChatMessage
from agentevolver.schema.trajectory import Reward

__all__ = ["POLICY_NAME", "ProgramEpisodes"]

logger = logging.getLogger(__name__)

#: The model name programs are told to send (any name is answered by the policy).
POLICY_NAME = "policy"
#: The API key programs are given: the gateway checks none (it listens on the run's own host), but SDKs want one.
_API_KEY = "agentevolver"


class ProgramEpisodes:
    """Runs agent-program episodes (module docstring); one per worker process, shared by its episodes.

    The gateway server starts on the first episode, on the event loop that runs the episodes.
    """

    def __init__(self, config: AgentProgramConfig, flow_config: AgentFlowConfig, *, tokenizer: Any,
                 env_client: EnvClient, generate: GenerateFn, max_model_len: int, max_prompt_len: int | None = None,
                 max_response_len: int | None = None, retriever: Any = None) -> None:
        self.config = config
        self.flow_config = flow_config
        self.env = env_client
        self.retriever = retriever
        self.program = AgentProgram(config)
        check_plugin_names(flow_config)
        self.parser = make_parser(flow_config.tools)
        budgets = context_config(flow_config, max_model_len=max_model_len, max_prompt_len=max_prompt_len,
                                 max_response_len=max_response_len)
        self.gateway = Gateway(tokenizer=tokenizer, generate=generate, parser=self.parser,
                               context_template=flow_config.context_template, context_config=budgets,
                               served_name=POLICY_NAME, max_calls=flow_config.max_steps,
                               max_tokens_per_turn=flow_config.max_tokens_per_turn)
        self.server = GatewayServer(self.gateway, host=config.host, port=config.port)
        self._started = False
        self._start_lock: asyncio.Lock | None = None
        self._env_tools: dict[str, list[dict[str, Any]]] = {}

    async def ensure_started(self) -> str:
        """Start the gateway server on this event loop once; its URL."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                await self.server.start()
                self._started = True
        return self.server.url

    async def run(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult:
        """Run one episode; never raises for a program, environment or generation failure."""
        url = await self.ensure_started()
        started = time.perf_counter()
        counts: Counter[str] = Counter()
        instance_id: str | None = None
        try:
            created = await self.env.acreate(spec.env_type, spec.task_id, params=spec.env_params)
            instance_id = created.info.instance_id
            opening = initial_messages(created.state, spec)
            tools = await self._tools_of(spec.env_type)
        except EnvClientError as err:
            if instance_id is not None:
                await self._release(instance_id)
            return _failed(spec, "env_error", f"environment request failed: {err}", instance_id,
                           time.perf_counter() - started)
        try:
            return await self._episode(spec, sampling_params, url, instance_id, opening, tools, counts, started)
        finally:
            await self._release(instance_id)

    # ------------------------------------------------------------------ the episode
    async def _episode(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any], url: str, instance_id: str,
                       opening: list[ChatMessage], tools: list[dict[str, Any]], counts: Counter[str],
                       started: float) -> EpisodeResult:
        experience, retrieve_errors = await self._experience(spec, opening)
        episode_id = new_episode_id()
        request_id = f"{spec.group_id}-{spec.rollout_id}-{uuid.uuid4().hex[:8]}"
        self.gateway.open(episode_id, request_id=request_id, sampling_params=sampling_params, experience=experience)
        base = f"{url}/episodes/{episode_id}"
        task = ProgramTask(
            episode_id=episode_id, base_url=f"{base}/v1", api_key=_API_KEY, model=POLICY_NAME,
            reward_url=f"{base}/reward", task_id=spec.task_id, env_type=spec.env_type,
            query=next((m.content for m in reversed(opening) if m.role == "user"), ""),
            messages=[m.model_dump(exclude_none=True) for m in opening], tools=tools, metadata=spec.metadata)
        try:
            run = await self.program.run(task)
        finally:  # also when the episode is cancelled: its endpoint must not outlive it
            episode = await self.gateway.close(episode_id)
        termination, error, fault = self._ending(run, episode)
        reward = Reward(description="no reward: the episode failed")
        if fault is None and termination != "error":
            reward, fault, error = await self._reward(run, episode, instance_id, counts, error)
            if fault is not None:
                termination = "error"
        if fault is not None:
            counts["program_failed"] += 1
            counts[f"program_{fault}"] += 1
        counts["calls"] += episode.calls.num_calls
        counts["refused_calls"] += episode.refused
        counts["generate_errors"] += episode.generate_errors
        return self._result(spec, episode, instance_id, termination, error, reward, counts, run,
                            retrieve_errors, time.perf_counter() - started)

    @staticmethod
    def _ending(run: ProgramRun, episode: GatewayEpisode) -> tuple[Termination, str | None, str | None]:
        """How the episode ended: (termination, error text, program fault or None)."""
        calls = episode.calls
        if episode.generate_errors and run.fault is not None:
            return "error", f"generation failed ({episode.generate_errors} call(s)); {run.error}", None
        if run.fault is not None and (calls.budget_exhausted or episode.max_steps_hit):
            # the program stopped because the gateway refused a call at a budget: a normal end, trained (a
            # first prompt already over the budget ends like an agent-flow episode's: no sample, no failure)
            return ("budget" if calls.budget_exhausted else "max_steps"), run.error, None
        if run.fault is not None:
            return "error", run.error, run.fault
        if calls.num_calls == 0:
            return "error", "the program made no call to its base_url", "no_call"
        if calls.budget_exhausted:
            return "budget", None, None
        return ("max_steps" if episode.max_steps_hit else "finished"), None, None

    async def _reward(self, run: ProgramRun, episode: GatewayEpisode, instance_id: str, counts: Counter[str],
                      error: str | None) -> tuple[Reward, str | None, str | None]:
        """(reward, fault or None, error text) from the program or the environment (``agent_program.reward``)."""
        if self.config.reward == "env":
            answer = _answer(run.value) or (episode.reported.answer if episode.reported else None)
            return await self._env_reward(answer or episode.calls.last_reply_text(), instance_id, counts), None, error
        if run.fault is not None:  # it stopped at a refused call (budget / max_steps), returning nothing
            return Reward(description=f"no reward: the program stopped when the gateway refused a call "
                                      f"({run.error})"), None, error
        value = run.value if run.value is not None else (
            episode.reported.model_dump() if episode.reported is not None else None)
        try:
            outcome, success = _reward_of(value)
        except ValueError as err:
            return Reward(description="no reward: the program's reward was unusable"), "bad_reward", str(err)
        if success is None:
            success = outcome >= self.flow_config.success_threshold
        return Reward(outcome=outcome, success_rate=1.0 if success else 0.0,
                      description=f"the program's reward {outcome:g}"), None, error

    async def _env_reward(self, answer: str, instance_id: str, counts: Counter[str]) -> Reward:
        """The environment's score of the program's answer, stepped into the instance as the final message."""
        try:
            await self.env.astep(instance_id, ChatMessage(role="assistant", content=answer))
            score = await self.env.aevaluate(instance_id, sparse=self.flow_config.sparse_reward)
        except EnvClientError as err:
            counts["evaluate_errors"] += 1
            return Reward(description=f"evaluate failed: {err}")
        if not math.isfinite(score):
            return Reward(description=f"the environment returned a non-finite score ({score}); scored 0")
        return Reward(outcome=score, success_rate=1.0 if score >= self.flow_config.success_threshold else 0.0,
                      description=f"environment score {score:g}")

    async def _experience(self, spec: EpisodeSpec, opening: list[ChatMessage]) -> tuple[Any, int]:
        """Self-Navigating's experience for this episode (as the agent flow gets it) and retrieval errors."""
        if spec.experience is not None or not spec.add_experience or self.retriever is None:
            return spec.experience, 0
        retrieval = await self.retriever.for_episode(spec.group_id, opening, task_id=spec.task_id)
        experience = retrieval.experience
        if isinstance(experience, list):
            experience = in_policy_dialect(experience, self.parser)
        return experience, int(retrieval.error is not None)

    async def _tools_of(self, env_type: str) -> list[dict[str, Any]]:
        if env_type not in self._env_tools:
            self._env_tools[env_type] = list(await self.env.atools(env_type) or [])
        return self._env_tools[env_type]

    async def _release(self, instance_id: str) -> None:
        try:
            await self.env.arelease(instance_id)
        except EnvClientError as err:
            logger.warning("releasing instance %s failed: %s", instance_id, err)

    def _result(self, spec: EpisodeSpec, episode: GatewayEpisode, instance_id: str, termination: Termination,
                error: str | None, reward: Reward, counts: Counter[str], run: ProgramRun, retrieve_errors: int,
                seconds: float) -> EpisodeResult:
        calls = episode.calls
        samples = calls.samples(task_id=spec.task_id, group_id=spec.group_id, rollout_id=spec.rollout_id,
                                reward=reward, strip_experience=spec.train_mode == "discard",
                                extras={"termination": termination})
        metrics: dict[str, float] = {"time/total_s": seconds, "time/program_s": run.seconds}
        metrics.update({f"episode/{key}": float(value) for key, value in counts.items()})
        metrics["episode/program_failed"] = float(counts["program_failed"])
        metrics["episode/generated_tokens"] = float(sum(len(r.response_ids) for r in calls.records))
        metrics.update({f"context/{key}": value for key, value in calls.metrics().items()})
        metrics["exp/injected"] = float(calls.experience_injected)
        metrics["exp/stripped"] = float(any(sample.exp_mask for sample in samples))
        metrics["exp/retrieve_errors"] = float(retrieve_errors)
        return EpisodeResult(task_id=spec.task_id, env_type=spec.env_type, group_id=spec.group_id,
                             rollout_id=spec.rollout_id, instance_id=instance_id, termination=termination,
                             error=error, num_turns=calls.num_calls, reward=reward, samples=samples,
                             messages=calls.messages(), metrics=metrics, played_task=spec.played_task)


def _answer(value: Any) -> str | None:
    """The program's final answer in its return value: a string, or a dict's ``answer``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("answer"), str):
        return value["answer"]
    return None


def _reward_of(value: Any) -> tuple[float, bool | None]:
    """(reward, success or None) from a number or ``{"reward": number, "success"?: bool}``; ValueError says
    what was wrong."""
    success = None
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise ValueError(f"the program returned a dict without 'reward' (keys: {sorted(value)[:8]})")
        success = value.get("success")
        if success is not None and not isinstance(success, bool):
            raise ValueError(f"the program's 'success' must be true or false; got {success!r}")
        value = value["reward"]
    if value is None:
        raise ValueError("the program gave no reward: return a number (or {'reward': ...}) or POST it to "
                         "its reward_url; or set agent_program.reward=env")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"the program's reward must be a number; got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"the program's reward must be finite; got {value}")
    return float(value), success


def _failed(spec: EpisodeSpec, termination: Termination, error: str, instance_id: str | None,
            seconds: float) -> EpisodeResult:
    return EpisodeResult(task_id=spec.task_id, env_type=spec.env_type, group_id=spec.group_id,
                         rollout_id=spec.rollout_id, instance_id=instance_id, termination=termination, error=error,
                         reward=Reward(description="no reward: the episode failed before the program ran"),
                         metrics={"time/total_s": seconds}, played_task=spec.played_task)
