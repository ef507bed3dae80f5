"""The ``agent_flow`` section's plug-in names checked against their registries, and its context budgets joined.

The section itself is config data (:mod:`agentevolver.config.agent_flow`), which imports no mechanism; the
registries of context managers and tool-call parsers live here, in the mechanisms. So the names are checked
by :func:`plugin_name_errors`, which the entry points pass to :func:`agentevolver.config.validate_config` (its
messages join the section's other errors, all reported at once), and again where each plug-in is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentevolver.config.agent_flow import AgentFlowConfig
from agentevolver.errors import ConfigError
from agentevolver.module.context_manager import ContextManagerConfig, context_manager_names
from agentevolver.module.tools.config import parser_for_key

__all__ = ["check_plugin_names", "context_config", "plugin_name_errors"]


def plugin_name_errors(sections: Mapping[str, Any]) -> list[str]:
    """One message per unknown plug-in name in the raw config ``sections`` (``agent_flow.context_template``,
    ``agent_flow.tools.tool_parser``), each naming its key and the known names."""
    flow = sections.get("agent_flow")
    if not isinstance(flow, Mapping):
        return []
    errors = []
    template = flow.get("context_template", AgentFlowConfig.model_fields["context_template"].default)
    names = context_manager_names()
    if template not in names:
        errors.append(f"agent_flow.context_template: must be one of {', '.join(names)}; got {template!r}")
    tools = flow.get("tools")
    if isinstance(tools, Mapping) and "tool_parser" in tools:
        try:
            parser_for_key(tools["tool_parser"])
        except ConfigError as err:
            errors.append(str(err))
    return errors


def check_plugin_names(config: AgentFlowConfig) -> None:
    """Raise one :class:`ConfigError` listing every unknown plug-in name of an ``agent_flow`` section: where a
    flow or gateway is built, so a config that skipped the entry points' check still fails before an episode."""
    errors = plugin_name_errors({"agent_flow": config.model_dump()})
    if errors:
        raise ConfigError("; ".join(errors))


def context_config(config: AgentFlowConfig, *, max_model_len: int, max_prompt_len: int | None = None,
                   max_response_len: int | None = None) -> ContextManagerConfig:
    """The context manager's config: the section's options plus the token budgets of the run."""
    return ContextManagerConfig(max_model_len=max_model_len, max_prompt_len=max_prompt_len,
                                max_response_len=max_response_len, **config.context.model_dump())
