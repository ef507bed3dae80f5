"""One episode, exactly as tokens: create -> (generate -> parse -> act -> observe)* -> evaluate -> release.

:class:`AgentFlow` is shared by all episodes of a worker (it holds only configuration, the parser and a
cache of environment tool schemas); each :meth:`AgentFlow.run` call owns its context manager, its
:class:`ToolSet` and its environment instance. Generation goes through ``generate(request_id, *,
prompt_ids, sampling_params) -> TokenOutput``: verl's ``LLMServerClient.generate`` on a GPU cluster, or
:class:`agentevolver.backends.cpu.HFGenerator` on a CPU; one request id per episode keeps it on one server
(prefix caching). The instance is released in every outcome, and every failure becomes the episode's
``termination``/``error`` rather than an exception, so one bad episode never costs a training step.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Protocol

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.config.agent_flow import AgentFlowConfig
from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec, Termination
from agentevolver.module.agent_flow.madness import is_mad
from agentevolver.module.agent_flow.plugins import check_plugin_names, context_config
from agentevolver.module.context_manager import (
    Author,
    ContextManager,
    ContextManagerConfig,
    ContextMessage,
    make_context_manager,
)
from agentevolver.module.exp_manager.retriever import in_policy_dialect
from agentevolver.module.tools import (
    ParsedAction,
    ToolRegistry,
    ToolSet,
    default_registry,
    summarize_tool_metrics,
)
from agentevolver.module.tools.config import execute_kwargs, fold_rewards, make_parser, toolset
from agentevolver.schema.message import ChatMessage, ToolCall
from agentevolver.schema.trajectory import Reward

__all__ = ["AgentFlow", "GenerateFn", "clipper_for", "import_tool_modules", "initial_messages"]

logger = logging.getLogger(__name__)

#: Observation for an action whose tool-call blocks could not be read (nothing was executed).
PARSE_ERROR_OBSERVATION = (
    "Your last message contained a malformed action, so nothing was executed:\n{errors}\n"
    "Fix the format and try again."
)


class GenerateFn(Protocol):
    """verl's ``LLMServerClient.generate`` signature; returns an object with ``token_ids``, ``log_probs``."""

    def __call__(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> Awaitable[Any]: ...


def import_tool_modules(modules: list[str]) -> None:
    """Import the modules named in ``agent_flow.tool_modules`` (they register tools when imported)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"agent_flow.tool_modules: cannot import {name!r} ({err}); give an importable "
                              "module path such as 'my_project.tools'") from err


def clipper_for(config: AgentFlowConfig, llm_config: Any) -> Any:
    """The ``context_clipper`` LLM role client when the context manager is ``self_clip``, else None."""
    if config.context_template != "self_clip":
        return None
    from agentevolver.client.llm_client import client_for_role

    return client_for_role(llm_config, "context_clipper")


def initial_messages(state: list[ChatMessage], spec: EpisodeSpec) -> list[ChatMessage]:
    """An episode's opening messages: the environment's, where a task with its own query (a synthetic task)
    replaces the last user message (or adds one)."""
    messages = list(state)
    if spec.query is not None:
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].role == "user":
                messages[index] = messages[index].model_copy(update={"content": spec.query})
                break
        else:
            messages.append(ChatMessage(role="user", content=spec.query))
    return messages


class _EpisodeState:
    """Counters of one episode (kept off the shared AgentFlow so concurrent episodes never mix)."""

    def __init__(self) -> None:
        self.timers: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.parse_errors_in_row = 0
        self.env_errors_in_row = 0
        self.mad = False
        self.env_rewards: list[float] = []
        self.final_observation: list[ChatMessage] = []
        #: Self-Navigating: the episode got experience; its retrieval failed (reported as ``exp/*``).
        self.experience_injected = False
        self.retrieve_errors = 0


class AgentFlow:
    """Runs episodes; see the module docstring.

    ``max_model_len``, ``max_prompt_len`` and ``max_response_len`` are the token budgets of the run (under
    verl: :func:`~agentevolver.verl.agent_loop.flow_budgets`). ``clipper`` is the LLM role object
    for ``self_clip`` (:func:`clipper_for`).
    """

    def __init__(
        self,
        config: AgentFlowConfig,
        *,
        tokenizer: Any,
        env_client: EnvClient,
        generate: GenerateFn,
        max_model_len: int,
        max_prompt_len: int | None = None,
        max_response_len: int | None = None,
        tool_registry: ToolRegistry | None = None,
        clipper: Any = None,
        retriever: Any = None,
    ) -> None:
        self.config = config
        #: Self-Navigating's :class:`~agentevolver.module.exp_manager.retriever.ExperienceRetriever` (None =
        #: episodes marked ``add_experience`` run without experience).
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.env = env_client
        self.generate = generate
        self.context_config: ContextManagerConfig = context_config(
            config, max_model_len=max_model_len, max_prompt_len=max_prompt_len, max_response_len=max_response_len
        )
        import_tool_modules(config.tool_modules)
        check_plugin_names(config)  # after the user's modules, which may register context managers or parsers
        self.registry = tool_registry if tool_registry is not None else default_registry()
        self.parser = make_parser(config.tools)
        #: The parser's own stop tokens (a call closed by a token that is not EOS, e.g. GLM's
        #: ``<|observation|>``): sent with every generation so the model stops where its tool must answer.
        self.stop_token_ids: list[int] = self.parser.stop_token_ids(tokenizer) if tokenizer is not None else []
        self.clipper = clipper
        if config.context_template == "self_clip" and clipper is None:
            raise ConfigError("agent_flow.context_template=self_clip needs the context_clipper LLM role "
                              "(llm.roles.context_clipper)")
        self._env_tools: dict[str, list[dict[str, Any]]] = {}
        self._env_tools_lock = asyncio.Lock()

    # ------------------------------------------------------------------ public
    async def run(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult:
        """Run one episode; never raises for environment, model or tool failures (see ``termination``).

        An attempt whose environment failed (``env_error``: /create failed, the instance was lost; or its
        /evaluate failed, so it has no reward to train on: ``EpisodeResult.failure == "env"``) is run again
        from the start, at most ``agent_flow.episode_retries`` times after a doubling back-off: an env
        service that died and was started again by the launcher has lost its instances, and a fresh attempt
        with the same weights is as on-policy as the first. The dropped attempts are ``episode/restarts``.
        """
        retries = 0
        while True:
            result = await self._attempt(spec, sampling_params)
            if result.failure != "env" or retries >= self.config.episode_retries:
                break
            delay = self.config.episode_retry_backoff_s * 2 ** retries
            retries += 1
            logger.warning("episode %s/%s: the environment failed (%s); running it again in %g s (retry %d of %d)",
                           spec.task_id, spec.rollout_id, result.error or result.reward.description, delay, retries,
                           self.config.episode_retries)
            await asyncio.sleep(delay)
        result.metrics["episode/restarts"] = float(retries)
        return result

    async def _attempt(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult:
        """One attempt at the episode (see :meth:`run`)."""
        state = _EpisodeState()
        started = time.perf_counter()
        request_id = f"{spec.group_id}-{spec.rollout_id}-{uuid.uuid4().hex[:8]}"
        instance_id: str | None = None
        cm: ContextManager | None = None
        termination: Termination = "error"
        error: str | None = None
        reward = Reward(description="no reward: the episode failed before evaluation")
        async with AsyncExitStack() as stack:
            tools: ToolSet = toolset(self.config.tools, self.registry, request_id, spec.tool_selection)
            await stack.enter_async_context(tools)
            try:
                env_tools = await self._tools_of(spec.env_type)
                schemas = self._merge_schemas(env_tools, tools.schemas())
                created = await self._timed(state, "env_s", self.env.acreate(
                    spec.env_type, spec.task_id, params=spec.env_params))
                instance_id = created.info.instance_id
                stack.push_async_callback(self._release, instance_id)
                prompt_tools = (schemas or None) if self.config.tools.schemas_in_prompt else None
                cm = make_context_manager(self.config.context_template, self.tokenizer, self.context_config,
                                          tools=prompt_tools, llm=self.clipper)
                initial = initial_messages(created.state, spec)
                cm.start(initial, experience=await self._experience(spec, initial, state))
                termination, error = await self._loop(cm, tools, schemas, instance_id, sampling_params,
                                                      request_id, state)
                if termination != "env_error":
                    reward = await self._reward(instance_id, tools, state)
            except EnvClientError as err:
                termination, error = "env_error", f"environment request failed: {err}"
            except (ConfigError, asyncio.CancelledError):
                raise
            except Exception as err:
                logger.exception("episode %s/%s failed", spec.task_id, spec.rollout_id)
                termination, error = "error", f"{type(err).__name__}: {err}"
            if state.mad and self.config.madness.enable:
                reward = reward.model_copy(update={"madness": -1.0})
                if self.config.madness.penalize:
                    reward = reward.model_copy(update={
                        "outcome": self.config.madness.penalty_reward,
                        "description": f"{reward.description} [repetitive output: penalised]".strip(),
                    })
            tool_metrics = summarize_tool_metrics(tools.results)
        state.timers["total_s"] = time.perf_counter() - started
        return self._result(spec, cm, instance_id, termination, error, reward, state, tool_metrics)

    # ------------------------------------------------------------------ the loop
    async def _loop(
        self,
        cm: ContextManager,
        tools: ToolSet,
        schemas: list[dict[str, Any]],
        instance_id: str,
        sampling_params: Mapping[str, Any],
        request_id: str,
        state: _EpisodeState,
    ) -> tuple[Termination, str | None]:
        config = self.config
        for step in range(config.max_steps):
            if cm.exhausted:
                return "budget", None
            max_tokens = cm.remaining_budget()
            if config.max_tokens_per_turn is not None:
                max_tokens = min(max_tokens, config.max_tokens_per_turn)
            params = {**sampling_params, "max_tokens": max_tokens}
            params.setdefault("logprobs", True)
            if self.stop_token_ids:
                params["stop_token_ids"] = sorted({*(params.get("stop_token_ids") or ()), *self.stop_token_ids})
            output = await self._timed(state, "generate_s", self.generate(
                request_id, prompt_ids=cm.next_prompt_ids(), sampling_params=params))
            log_probs = output.log_probs if params.get("logprobs") else None
            message = cm.add_generation(output.token_ids, log_probs, step=step)
            generated = message.generated_ids or ()
            state.counts["generated_tokens"] += len(generated)
            if config.madness.enable and is_mad(generated, ngram_size=config.madness.ngram_size,
                                                min_tokens=config.madness.min_tokens,
                                                max_repeat_ratio=config.madness.max_repeat_ratio):
                state.mad = True
                state.counts["mad_steps"] += 1
                if config.madness.terminate:
                    return "madness", None
            action = self.parser.parse(message.content, step=step, tools=schemas)
            if action.errors and not action.tool_calls and action.final_answer is None:
                state.counts["parse_errors"] += 1
                state.parse_errors_in_row += 1
                if config.on_parse_error == "terminate" or state.parse_errors_in_row >= config.max_parse_errors:
                    return "parse_error", "; ".join(action.errors)
                if config.on_parse_error == "feedback":
                    text = PARSE_ERROR_OBSERVATION.format(errors="\n".join(f"- {e}" for e in action.errors))
                    await self._observe(cm, [ChatMessage(role="user", content=text)])
                    continue
            else:
                state.parse_errors_in_row = 0
            ended, observations = await self._act(action, message.content, tools, instance_id, state)
            if ended is not None:
                return ended
            await self._observe(cm, observations)
        return ("budget" if cm.exhausted else "max_steps"), None

    async def _observe(self, cm: ContextManager, observations: list[ChatMessage]) -> None:
        """Append observations; ``self_clip`` may call its archivist LLM here (a blocking HTTP call), so it
        runs in a thread to keep the other episodes on this event loop moving."""
        if self.config.context_template == "self_clip":
            await asyncio.to_thread(cm.add_observation, observations)
        else:
            cm.add_observation(observations)

    async def _act(
        self,
        action: ParsedAction,
        text: str,
        tools: ToolSet,
        instance_id: str,
        state: _EpisodeState,
    ) -> tuple[tuple[Termination, str | None] | None, list[ChatMessage]]:
        """Run local tool calls and/or step the environment: ``(termination or None, observations)``.

        Calls naming a local tool run here (no local tool shares a name with an environment tool: the
        schemas were merged with that check); the rest go to the environment with the assistant message.
        When every call is local the environment is not stepped (it would see calls it does not know).
        """
        local_names = set(tools.names)
        local_calls = [c for c in action.tool_calls if c.function.name in local_names]
        env_calls = [c for c in action.tool_calls if c.function.name not in local_names]
        observations: list[ChatMessage] = []
        if local_calls:
            state.counts["tool_calls"] += len(local_calls)
            results = await self._timed(state, "tool_s", tools.execute(local_calls, **execute_kwargs(self.config.tools)))
            observations += [result.to_message() for result in results]
        if local_calls and not env_calls:
            return None, observations
        state.counts["env_steps"] += 1
        step = await self._timed(state, "env_s", self.env.astep(
            instance_id, self._env_action(text, env_calls)))
        state.env_rewards.append(float(step.reward))
        if step.info.get("fallback"):
            state.counts["env_errors"] += 1
            state.env_errors_in_row += 1
            if step.info.get("instance_lost") or state.env_errors_in_row >= self.config.max_env_errors:
                return ("env_error", str(step.info.get("error", "environment step failed"))), observations
        else:
            state.env_errors_in_row = 0
        if step.is_terminated:
            state.final_observation = list(step.state)
            return ("finished", None), observations
        return None, observations + step.state

    @staticmethod
    def _env_action(text: str, calls: list[ToolCall]) -> ChatMessage:
        """The assistant message the environment sees: the generated text and the calls meant for it."""
        return ChatMessage(role="assistant", content=text, tool_calls=calls or None)

    # ------------------------------------------------------------------ pieces
    async def _tools_of(self, env_type: str) -> list[dict[str, Any]]:
        """The environment's tool schemas, fetched once per env type and cached."""
        async with self._env_tools_lock:
            if env_type not in self._env_tools:
                listed = await self.env.atools(env_type)
                self._env_tools[env_type] = list(listed or [])
            return self._env_tools[env_type]

    @staticmethod
    def _merge_schemas(env_tools: list[dict[str, Any]], local: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Environment tools first, then local tools; a name in both is a configuration error."""
        env_names = {schema["function"]["name"] for schema in env_tools}
        clash = sorted(env_names & {schema["function"]["name"] for schema in local})
        if clash:
            raise ConfigError(f"tool name(s) {clash} are served by the environment and registered locally "
                              "(agent_flow.tool_modules); rename the local tool(s)")
        return [*env_tools, *local]

    async def _experience(self, spec: EpisodeSpec, initial: list[ChatMessage],
                          state: _EpisodeState) -> str | list[ChatMessage] | None:
        """The experience of this episode: the spec's own text, or retrieved for its task when the plan says
        so (Self-Navigating: advice text, or exemplar turns in the policy's tool-call dialect); a failed
        retrieval means none, counted in ``exp/retrieve_errors``."""
        experience: str | list[ChatMessage] | None = spec.experience
        if experience is None and spec.add_experience and self.retriever is not None:
            retrieval = await self.retriever.for_episode(spec.group_id, initial, task_id=spec.task_id)
            state.timers["memory_s"] += retrieval.seconds
            state.retrieve_errors += retrieval.error is not None
            experience = retrieval.experience
            if isinstance(experience, list):
                experience = in_policy_dialect(experience, self.parser)
        state.experience_injected = bool(experience)
        return experience

    async def _reward(self, instance_id: str, tools: ToolSet, state: _EpisodeState) -> Reward:
        """The environment's score with the tool rewards folded in; an evaluate failure scores 0."""
        try:
            score = await self._timed(state, "env_s", self.env.aevaluate(
                instance_id, sparse=self.config.sparse_reward))
        except EnvClientError as err:
            state.counts["evaluate_errors"] += 1
            return Reward(description=f"evaluate failed: {err}")
        if not math.isfinite(score):
            return Reward(description=f"the environment returned a non-finite score ({score}); scored 0")
        outcome = fold_rewards(self.config.tools, score, tools.rewards)
        return Reward(outcome=outcome, success_rate=1.0 if score >= self.config.success_threshold else 0.0,
                      description=f"environment score {score:g}")

    async def _release(self, instance_id: str) -> None:
        await self.env.arelease(instance_id)

    @staticmethod
    async def _timed(state: _EpisodeState, key: str, awaitable: Awaitable[Any]) -> Any:
        begin = time.perf_counter()
        try:
            return await awaitable
        finally:
            state.timers[key] += time.perf_counter() - begin

    def _result(
        self,
        spec: EpisodeSpec,
        cm: ContextManager | None,
        instance_id: str | None,
        termination: Termination,
        error: str | None,
        reward: Reward,
        state: _EpisodeState,
        tool_metrics: dict[str, float],
    ) -> EpisodeResult:
        metrics: dict[str, float] = {f"time/{k}": float(v) for k, v in state.timers.items()}
        metrics.update({f"episode/{k}": float(v) for k, v in state.counts.items()})
        metrics["episode/env_reward_sum"] = float(sum(state.env_rewards))
        metrics.update(tool_metrics)
        samples, messages, num_turns = [], [], 0
        if cm is not None:
            metrics.update({f"context/{k}": v for k, v in cm.metrics().items()})
            num_turns = cm.num_turns
            extras = {"termination": termination}
            samples = cm.to_samples(task_id=spec.task_id, group_id=spec.group_id, rollout_id=spec.rollout_id,
                                    reward=reward, strip_experience=spec.train_mode == "discard", extras=extras)
            metrics["exp/injected"] = float(state.experience_injected)
            metrics["exp/stripped"] = float(any(sample.exp_mask for sample in samples))
            final = [ContextMessage(m, Author.ENV, step=num_turns - 1, in_context=False)
                     for m in state.final_observation]
            messages = [message.to_dict() for message in [*cm.messages, *final]]
        metrics["exp/retrieve_errors"] = float(state.retrieve_errors)
        return EpisodeResult(
            task_id=spec.task_id, env_type=spec.env_type, group_id=spec.group_id, rollout_id=spec.rollout_id,
            instance_id=instance_id, termination=termination, error=error, num_turns=num_turns, reward=reward,
            samples=samples, messages=messages, metrics=metrics, played_task=spec.played_task,
        )
