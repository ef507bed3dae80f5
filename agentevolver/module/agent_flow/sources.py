"""Where episodes come from: a registry of episode sources, each built once per worker process.

An episode source turns an :class:`~agentevolver.module.agent_flow.episode.EpisodeSpec` into an
:class:`~agentevolver.module.agent_flow.episode.EpisodeResult`; everything after the episode (grader, custom
reward, training rows) is the same whichever source ran it. Two are known:

* ``flow``: the agent flow (:class:`~agentevolver.module.agent_flow.flow.AgentFlow`), registered here;
* ``program``: the user's agent program through the OpenAI-compatible gateway, registered by the gateway
  itself (:mod:`agentevolver.gateway.source`; the verl plugin imports that module in every process that runs
  agent loops), so the trainer's side never imports the gateway;
* ``game``: one game per episode, the policy playing ``game.trained_seats``
  (:mod:`agentevolver.module.agent_flow.game`), registered here.

:func:`source_name` picks one from the settings (``agent_program`` set = ``program``, ``game.trained_seats``
set = ``game``). A factory takes the
:class:`SourceParts` of its worker process (settings, tokenizer, the rollout's ``generate``, the env
client's connection pool, the experience retriever, token budgets) and returns a source that holds no
per-episode state, so every episode of the process shares it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agentevolver.client.env_client import EnvClient
from agentevolver.config.schema import AgentEvolverSettings
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.module.agent_flow.flow import AgentFlow, GenerateFn, clipper_for
from agentevolver.registry import Registry

__all__ = ["EPISODE_SOURCES", "FLOW_SOURCE", "GAME_SOURCE", "PROGRAM_SOURCE", "EpisodeSource", "SourceParts", "build_source",
           "source_name"]

#: The agent flow's name in :data:`EPISODE_SOURCES`.
FLOW_SOURCE = "flow"
#: The agent program's (gateway) name in :data:`EPISODE_SOURCES`.
PROGRAM_SOURCE = "program"
#: Games (:mod:`agentevolver.module.agent_flow.game`) in :data:`EPISODE_SOURCES`.
GAME_SOURCE = "game"


class EpisodeSource(Protocol):
    """Runs one episode; failures become data in the result (``termination``, ``failure``), never exceptions."""

    async def run(self, spec: EpisodeSpec, sampling_params: Mapping[str, Any]) -> EpisodeResult: ...


@dataclass(frozen=True)
class SourceParts:
    """What a source is built from, once per worker process. ``budgets`` holds ``max_prompt_len``,
    ``max_response_len`` and ``max_model_len`` (from verl's keys: ``agentevolver.verl.agent_loop.flow_budgets``)."""

    settings: AgentEvolverSettings
    tokenizer: Any
    generate: GenerateFn
    env_client: EnvClient
    budgets: Mapping[str, int]
    retriever: Any = None


#: name -> factory(parts) -> source.
EPISODE_SOURCES: Registry[Callable[[SourceParts], EpisodeSource]] = Registry(
    "episode source", "agent_program",
    hint="an episode source is picked by agent_program (set: 'program') and game.trained_seats (set: 'game'), "
         "else 'flow'")


@EPISODE_SOURCES.register(FLOW_SOURCE)
def agent_flow_source(parts: SourceParts) -> AgentFlow:
    """The agent flow with its parsed config, parser, tool catalogue and context-clipper client."""
    flow_config = parts.settings.agent_flow
    return AgentFlow(flow_config, tokenizer=parts.tokenizer, env_client=parts.env_client, generate=parts.generate,
                     clipper=clipper_for(flow_config, parts.settings.llm), retriever=parts.retriever,
                     **parts.budgets)


@EPISODE_SOURCES.register(GAME_SOURCE)
def game_source(parts: SourceParts) -> EpisodeSource:
    """Game episodes (:class:`~agentevolver.module.agent_flow.game.GameEpisodes`), imported when first built."""
    from agentevolver.module.agent_flow.game import GameEpisodes

    return GameEpisodes(parts.settings, tokenizer=parts.tokenizer, env_client=parts.env_client,
                        generate=parts.generate, **parts.budgets)


def source_name(settings: AgentEvolverSettings) -> str:
    """``program`` when ``agent_program`` names a callable or a command, ``game`` when ``game.trained_seats``
    is set, else ``flow``."""
    if settings.agent_program.enabled:
        return PROGRAM_SOURCE
    return GAME_SOURCE if settings.game.enabled else FLOW_SOURCE


def build_source(parts: SourceParts) -> EpisodeSource:
    """The source the settings pick, built from ``parts``; an unregistered one names the registered choices."""
    return EPISODE_SOURCES.get(source_name(parts.settings))(parts)
