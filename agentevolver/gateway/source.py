"""The gateway's episode source: registers ``program`` (agent-program episodes) in the episode-source registry.

Importing this module is the registration (:data:`agentevolver.module.agent_flow.sources.EPISODE_SOURCES`);
the verl plugin imports it in every process that imports verl's agent loop, so an agent-loop worker with
``agent_program`` set finds it without the agent loop importing the gateway. It stays light to import: the
gateway's server modules load when the first source is built, i.e. only in runs that use an agent program.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentevolver.module.agent_flow.sources import EPISODE_SOURCES, PROGRAM_SOURCE, SourceParts

if TYPE_CHECKING:
    from agentevolver.gateway.runner import ProgramEpisodes

__all__ = ["program_source"]


@EPISODE_SOURCES.register(PROGRAM_SOURCE)
def program_source(parts: SourceParts) -> ProgramEpisodes:
    """Agent-program episodes (:class:`~agentevolver.gateway.runner.ProgramEpisodes`): one gateway per process."""
    from agentevolver.gateway.runner import ProgramEpisodes

    settings = parts.settings
    return ProgramEpisodes(settings.agent_program, settings.agent_flow, tokenizer=parts.tokenizer,
                           env_client=parts.env_client, generate=parts.generate, retriever=parts.retriever,
                           **parts.budgets)
