"""The environment as task writer (``task_manager.writer: env``): tasks rendered from observations, no LLM.

Why: Self-Questioning has two parts whose effects an ablation must tell apart, exploring the environment
and *writing* tasks from what was seen. With a small writer model (SmolLM2-135M on calc: 0 tasks kept of
8 explorations, docs/task_manager.md) the second part measures the model, not the idea. Where an
exploration's observations determine a task completely (calc: the calculator was called with ``17 * 23``
and returned ``391``), the environment can write the task itself: each successful tool call the explorer
made becomes a question in the style of the environment's own tasks ("What is 17 * 23?"), its observed
result the answer, the observation the evidence. How a call reads as a question is environment knowledge,
so the environment service does it (capability ``task_writing``, ``POST /task_writing``:
:mod:`agentevolver.schema.task_writing`; calc's rules: :mod:`env_service.environments.calc.task_writing`);
this module only asks, like :mod:`agentevolver.module.adv_processor.env_labels` asks for step labels.

The rendered tasks are not trusted for being rendered: they go through the same proof check
(:func:`.summarizer.add_objectives` -> :func:`.proof.prove`, with the profile's ``answers``), real-time
filters and post filters as an LLM's. What the rendering dropped comes back counted
(:data:`~agentevolver.schema.task_writing.RENDER_COUNTS`) and is shown in the run's report, plus
``service_errors``: an exploration whose rendering the service did not answer (skipped, not fatal).
"""

from __future__ import annotations

import logging
from collections import Counter

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.errors import ConfigError
from agentevolver.module.task_manager.deps import TaskManagerDeps
from agentevolver.module.task_manager.proof import observations
from agentevolver.module.task_manager.summarizer import SummaryOutcome, add_objectives
from agentevolver.schema import Task, Trajectory
from agentevolver.schema.task_writing import TASK_WRITING, ObservedCall

__all__ = ["EnvWriter", "observed_calls"]

logger = logging.getLogger(__name__)


def observed_calls(trajectory: Trajectory) -> list[ObservedCall]:
    """The exploration's tool calls with their results, in order, as ``/task_writing`` takes them (what the
    proof check reads: :func:`.proof.observations`; nudges and other non-tool messages left out)."""
    return [ObservedCall(tool=obs.tool, arguments=obs.arguments, text=obs.text, call=obs.call)
            for obs in observations(trajectory) if obs.call is not None and obs.tool is not None]


class EnvWriter:
    """Writes task objectives from trajectories by asking the environment service (no LLM; thread-safe).

    The same interface as :class:`.summarizer.Summarizer`, so the manager runs either one.
    """

    def __init__(self, deps: TaskManagerDeps) -> None:
        self.deps = deps
        self.env: EnvClient = deps.env_client()
        if TASK_WRITING not in self.env.capabilities(deps.env_type):
            raise ConfigError(
                f"task_manager.writer is 'env' but environment {deps.env_type!r} does not offer the {TASK_WRITING!r} "
                f"capability (it cannot render a task from an exploration; GET /envs/{deps.env_type}/capabilities); "
                "set task_manager.writer=llm, or implement write_tasks in the environment "
                "(docs/task_manager.md, 'The task writer')")
        if deps.profile.answers is None:
            where = deps.section.env_profile or f"the shipped profile profiles/{deps.env_type}.json"
            raise ConfigError(
                f"task_manager.writer is 'env' but the environment profile of {deps.env_type!r} ({where}) declares "
                "no answers (how observations prove a rendered task's answer); set task_manager.writer=llm, or add "
                "answers (proved_by: observations) to the profile and point task_manager.env_profile at it "
                "(docs/task_manager.md, 'The task writer')")

    def summarize(self, seed: Task, trajectory: Trajectory) -> SummaryOutcome:
        """Ask the environment to render the exploration's calls, then prove and build objectives like an LLM's
        tasks. A service error skips the exploration (counted ``service_errors``), it does not stop the run."""
        try:
            rendering = self.env.write_tasks(self.deps.env_type, observed_calls(trajectory),
                                             seed_query=trajectory.query,
                                             limit=self.deps.section.tasks_per_exploration,
                                             all_renderings=self.deps.section.writer_all_renderings)
        except EnvClientError as err:
            logger.warning("exploration %s#%s: the environment wrote no tasks: %s", seed.task_id,
                           trajectory.rollout_id, err)
            outcome = SummaryOutcome(objectives=[], rendered=Counter(service_errors=1))
            outcome.errors.append(f"task_writing failed: {err}")
            return outcome
        outcome = SummaryOutcome(objectives=[], rendered=Counter(rendering.counts))
        add_objectives(self.deps, seed, trajectory, rendering.tasks, outcome)
        return outcome

    def identity(self) -> str:
        """Who writes the tasks, for the run's report."""
        return f"env: the {self.deps.env_type} environment renders each successful tool call (no LLM)"
