"""What the task manager's plug-ins may use, handed to each at construction (the reference's
``_inject_deps``): the validated settings, the environment client, the LLM role clients and the profile.

Plug-ins take the one object and pick what they need, so a new strategy, filter or grader that needs
something else needs no change to the manager's constructor calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from agentevolver.client.env_client import EnvClient
from agentevolver.client.llm_client import LLMClient, LLMClients
from agentevolver.config.schema import AgentEvolverSettings, TaskManagerSection
from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.profile import EnvProfile, load_profile, shipped_profiles

if TYPE_CHECKING:
    from agentevolver.module.task_manager.eval_overlap import EvalQueries

__all__ = ["ROLE_EXPLORER", "ROLE_FILTER", "ROLE_GRADER", "ROLE_SUMMARIZER", "TaskManagerDeps"]

#: The LLM roles (``llm.roles.<role>``) of Self-Questioning.
ROLE_EXPLORER = "task_explorer"
ROLE_SUMMARIZER = "task_summarizer"
ROLE_FILTER = "task_filter"
ROLE_GRADER = "task_grader"


@dataclass
class TaskManagerDeps:
    """Dependencies of task-manager plug-ins (see the module docstring).

    ``profile`` is loaded on first use (``task_manager.env_profile`` or the shipped one) unless given, so
    mixing tasks for an environment without a profile works as long as nothing is generated.
    """

    settings: AgentEvolverSettings
    env: EnvClient | None = None
    llm: LLMClients | None = None
    given_profile: EnvProfile | None = None

    @cached_property
    def profile(self) -> EnvProfile:
        if self.given_profile is not None:
            return self.given_profile
        if self.section.env_profile is None and self.env_type not in shipped_profiles() and self.env is not None:
            # No profile anywhere (e.g. mcp: any server's tools): derive one from the service's tool list.
            from agentevolver.module.task_manager.tool_profile import profile_from_tools

            tools = self.env.tools(self.env_type)
            if tools:
                return profile_from_tools(self.env_type, tools)
        return load_profile(self.env_type, self.section.env_profile)

    @property
    def section(self) -> TaskManagerSection:
        return self.settings.task_manager

    @property
    def env_type(self) -> str:
        return self.settings.env_service.env_type

    @property
    def create_params(self) -> dict[str, Any]:
        return dict(self.settings.env_service.create_params)

    @property
    def exploration_params(self) -> dict[str, Any]:
        """``/create`` params of an exploration's instance: the run's, with ``task_manager.exploration_params``
        over them (what only exploring asks of the environment, never a training episode)."""
        return {**self.create_params, **self.section.exploration_params}

    @property
    def synthetic_grader(self) -> str:
        """The grader synthetic tasks name: ``task_manager.grader.synthetic_grader``, where ``auto`` means
        ``reference`` when the profile declares that observations prove answers, else ``llm``."""
        name = self.section.grader.synthetic_grader
        if name != "auto":
            return name
        return "reference" if self.profile.answers is not None else "llm"  # the profile in use, already loaded

    @cached_property
    def eval_queries(self) -> EvalQueries:
        """The evaluation tasks' queries (``task_manager.eval_splits``), listed once per run on first use, shared
        by the ``eval_overlap`` filter and the run's report."""
        from agentevolver.module.task_manager.eval_overlap import EvalQueries  # it imports this module

        return EvalQueries(self)

    def client(self, role: str) -> LLMClient:
        """The shared client of ``llm.roles.<role>``."""
        if self.llm is None:
            raise ConfigError(f"the {role} LLM role is needed but no LLM clients were given")
        return self.llm.for_role(role)

    def env_client(self) -> EnvClient:
        if self.env is None:
            raise ConfigError("an environment client is needed (env_service.env_url) but none was given")
        return self.env
