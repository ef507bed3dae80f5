"""verl's agent-loop manager with its workers in this process (``trainer.agent_loop_workers``; why and when:
:mod:`agentevolver.verl.in_process`). Apart from the light module so that choosing imports no verl."""

from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker

from agentevolver.verl.in_process import InProcessWorker

__all__ = ["InProcessAgentLoopManager"]


class InProcessAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager whose workers are :class:`~agentevolver.verl.in_process.InProcessWorker` objects
    built from the arguments verl gives its worker actors; verl's ``generate_sequences`` calls them unchanged."""

    async def _init_agent_loop_workers(self) -> None:
        count = int(self.rollout_config.agent.num_workers)
        self.agent_loop_workers = [
            InProcessWorker(AgentLoopWorker, f"agent_loop_worker_{i}", self.config, self.llm_client,
                            self.teacher_client, self.reward_loop_worker_handles)
            for i in range(count)
        ]
