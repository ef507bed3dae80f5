"""Train agents written with any framework: an OpenAI-compatible gateway that records every call's tokens.

An agent program (a Python callable or a command, ``agent_program.*``) runs once per episode against
``<gateway>/episodes/<id>/v1``; the gateway answers with the policy through the run's rollout servers, token
in and token out, and folds the calls into training samples (:mod:`.calls`). docs/agent_gateway.md.
"""

from agentevolver.config.agent_program import AgentProgramConfig

__all__ = ["AgentProgramConfig"]
