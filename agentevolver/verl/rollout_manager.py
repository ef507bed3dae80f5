"""verl's agent-loop manager with Self-Navigating's experience plan applied to every batch it rolls out.

verl's trainer repeats each task's row ``rollout.n`` times and hands the batch straight to
``async_rollout_manager.generate_sequences`` (training and validation alike); that call is the one place
where a step's rows exist with their group ids before any episode starts, so the plan is drawn there. The
wrapper forwards everything else to verl's manager unchanged, so no verl code is copied or patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentevolver.module.exp_manager.manager import ExperienceManager

__all__ = ["ExperienceRolloutManager"]


class ExperienceRolloutManager:
    """Wraps verl's ``AgentLoopManager``; ``before_first`` runs once, before the first batch (the initial
    memory build needs the rollout servers, which exist only once workers are up)."""

    def __init__(self, inner: Any, manager: ExperienceManager,
                 before_first: Callable[[Any, bool, int], None] | None = None) -> None:
        self.inner = inner
        self.manager = manager
        self._before_first = before_first
        #: ``exp/*`` numbers of the last training batch's plan (merged into that step's metrics).
        self.last_plan: dict[str, float] = {}

    def generate_sequences(self, batch: Any) -> Any:
        validate = bool(batch.meta_info.get("validate", False))
        step = int(batch.meta_info.get("global_steps", 0))
        if self._before_first is not None:
            first, self._before_first = self._before_first, None
            first(self.inner, validate, step)
        plan = self.manager.plan(batch, validate=validate, step=step)
        if not validate:
            self.last_plan = plan
        return self.inner.generate_sequences(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
