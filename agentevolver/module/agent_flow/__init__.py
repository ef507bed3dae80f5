"""Agent flow: one multi-turn episode, from task to training samples, exactly as tokens.

* :class:`AgentFlow` - runs episodes (create -> generate -> parse -> act -> observe ... -> evaluate ->
  release) against the environment service, with any ``generate`` that has verl's
  ``LLMServerClient.generate`` signature.
* :class:`EpisodeSpec` / :class:`EpisodeResult` - what to run and what came out (samples, termination,
  reward, messages, metrics); :data:`TERMINATIONS` lists the ways an episode ends.
* :class:`AgentFlowConfig` - the ``agent_flow`` config section (data: :mod:`agentevolver.config.agent_flow`);
  :func:`~agentevolver.module.agent_flow.plugins.plugin_name_errors` checks its plug-in names.
* :class:`RolloutDumpWriter` / :func:`read_rollout_dump` - ``<run dir>/rollouts/step_<N>.jsonl``.
* ``agentevolver.verl.agent_loop`` - the same flow as a verl agent loop (``agentevolver``).

See docs/agent_flow.md and docs/rollout_dumps.md.
"""

from agentevolver.config.agent_flow import AgentFlowConfig, DumpConfig, FlowContextOptions, MadnessConfig
from agentevolver.module.agent_flow.dump import (
    ROLLOUT_DIR_NAME,
    RolloutDumpWriter,
    read_rollout_dump,
    rollout_dump_path,
)
from agentevolver.module.agent_flow.episode import TERMINATIONS, EpisodeResult, EpisodeSpec, Termination
from agentevolver.module.agent_flow.flow import AgentFlow, GenerateFn, import_tool_modules
from agentevolver.module.agent_flow.madness import is_mad, repeat_ratio

__all__ = [
    "ROLLOUT_DIR_NAME",
    "TERMINATIONS",
    "AgentFlow",
    "AgentFlowConfig",
    "DumpConfig",
    "EpisodeResult",
    "EpisodeSpec",
    "FlowContextOptions",
    "GenerateFn",
    "MadnessConfig",
    "RolloutDumpWriter",
    "Termination",
    "import_tool_modules",
    "is_mad",
    "read_rollout_dump",
    "repeat_ratio",
    "rollout_dump_path",
]
