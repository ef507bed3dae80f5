"""Stage ``metrics``: the step's summary numbers, verl's own: the data metrics of the episode rows (rewards,
advantages, lengths: each episode once), the timing metrics (``timing_s/*``, per-token timings), throughput
and the variance proxy; plus ``training/global_step`` and ``training/epoch``. ``timing_s/step`` is the step up
to here; this stage's own time (a few milliseconds) is measured after the records are made, so it is in none.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["summary_metrics"]


def summary_metrics(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``metrics``: verl's data, timing, throughput and variance metrics of the step (module docstring)."""
    from verl.trainer.ppo.metric_utils import (
        compute_data_metrics,
        compute_throughout_metrics,
        compute_timing_metrics,
        compute_variance_proxy_metrics,
    )

    state.timings["step"] = time.perf_counter() - state.started
    metrics = state.metrics
    metrics.update({"training/global_step": state.step, "training/epoch": state.epoch})
    metrics.update(compute_data_metrics(batch=state.episodes, use_critic=trainer.use_critic))
    metrics.update(compute_timing_metrics(batch=state.batch, timing_raw=state.timings))
    metrics.update(compute_throughout_metrics(batch=state.batch, timing_raw=state.timings,
                                              n_gpus=trainer.resource_pool_manager.get_n_gpus()))
    metrics.update(compute_variance_proxy_metrics(batch=state.episodes, gradient_norm=metrics.get("actor/grad_norm")))
    return state
