"""Failed episodes out of the update: the trainer's ``faults`` stage, and the rule that stops a run.

An episode whose environment, rollout server, ``/evaluate`` or grader failed has no trustworthy reward
(:attr:`~agentevolver.module.agent_flow.episode.EpisodeResult.failure`; the agent loop puts it in the batch's
``failure`` column). It still made a well-formed row, so verl's checks (shapes, rollout log-probs) hold, but
it must not teach the policy anything: here, in the step's ``faults`` stage right after the rollout,

- its response mask is cleared (no policy-gradient, KL or entropy term on its tokens) and its earlier samples
  (multi-sample context managers) are dropped, so it makes no row of its own;
- it gets a GRPO group of its own (a fresh ``uid``), so when the advantage stage runs, the 0 reward of a
  failed episode does not lower its task's baseline. ADCA groups by the same ``uid``.

The run stops, with a message naming the failing service(s) and quoting the most common error, when every
episode of a step failed or the failed share is above ``agent_flow.max_failed_share``: training on the rest of
such a step would be noise. The step's rollout dump is written before it stops.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from agentevolver.errors import AgentEvolverError

if TYPE_CHECKING:
    from agentevolver.verl.step.state import StepState
    from agentevolver.verl.step.trainer import AgentEvolverTrainer

__all__ = ["FAILURE_COLUMN", "TooManyFailures", "check_failed_share", "exclude_failed", "failure_metrics",
           "leave_out_failures"]

#: Non-tensor column the agent loop fills (``""`` = a good episode, else the failing service).
FAILURE_COLUMN = "failure"

#: How much of an episode's error the stop message quotes (the dump holds all of it).
_QUOTE_CHARS = 400

#: What to check when a service fails, by the name the episode gives it.
_WHERE = {
    "env": "the environment service (env_service.env_url; is it up? its log is in the run record)",
    "rollout": "the rollout server / the episode code (see the episodes' `error` in the rollout dump)",
    "grader": "the synthetic tasks' grader LLM (llm.roles.grader)",
    "program": "the agent program (agent_program.*; each episode's `error` in the rollout dump says what it did)",
}


class TooManyFailures(AgentEvolverError):
    """A training step in which too many episodes failed; the message names the services."""


def leave_out_failures(state: StepState, trainer: AgentEvolverTrainer) -> StepState:
    """Stage ``faults``: count the failed episodes, stop the run when there are too many
    (``agent_flow.max_failed_share``), and keep the rest of them out of the update (module docstring).

    A step that stops writes its rollout dump first (without advantages: none were computed), so the message's
    pointer to every episode's error is true."""
    columns = state.batch.non_tensor_batch
    state.metrics.update(failure_metrics(columns))
    limit = float(trainer.settings.agent_flow.max_failed_share)
    try:
        check_failed_share(columns, limit, state.step)
    except TooManyFailures:
        from agentevolver.verl.step.dump import write_step_dump

        check_failed_share(columns, limit, state.step, dump_path=write_step_dump(state, trainer))
    exclude_failed(state.batch)
    return state


def failed_mask(non_tensor_batch: dict[str, Any]) -> np.ndarray:
    """One bool per row: True where the episode failed (all False for a batch without the column)."""
    column = non_tensor_batch.get(FAILURE_COLUMN)
    if column is None:
        return np.zeros(0, dtype=bool)
    return np.asarray([bool(value) for value in column], dtype=bool)


def failure_metrics(non_tensor_batch: dict[str, Any]) -> dict[str, float]:
    """``episode/failed`` (count), ``episode/failed_share`` and ``episode/failed/<service>`` of a batch."""
    column = non_tensor_batch.get(FAILURE_COLUMN)
    if column is None:
        return {}
    services = Counter(str(value) for value in column if value)
    total = len(column)
    failed = sum(services.values())
    out = {"episode/failed": float(failed), "episode/failed_share": failed / total if total else 0.0}
    for service in ("env", "rollout", "grader", "program"):
        out[f"episode/failed/{service}"] = float(services.get(service, 0))
    return out


def check_failed_share(non_tensor_batch: dict[str, Any], max_failed_share: float, step: int,
                       dump_path: str | None = None) -> None:
    """Raise :class:`TooManyFailures` when every episode failed or the share exceeds ``max_failed_share``. The
    message names the services, quotes the most common error with how many episodes share it, and points at
    the step's rollout dump (``dump_path``, written before the stop) where every episode's error is."""
    mask = failed_mask(non_tensor_batch)
    if not mask.size or not mask.any():
        return
    share = float(mask.mean())
    if not mask.all() and share <= max_failed_share:
        return
    services = Counter(str(value) for value in non_tensor_batch[FAILURE_COLUMN] if value)
    named = "; ".join(f"{count} x {service}: check {_WHERE.get(service, service)}"
                      for service, count in services.most_common())
    what = "every episode" if mask.all() else f"{int(mask.sum())} of {mask.size} episodes ({share:.0%})"
    where = (f"every episode's error is in the step's rollout dump, {dump_path}" if dump_path
             else "the rollout dump is off or could not be written (agent_flow.dump), so only this error is shown")
    raise TooManyFailures(
        f"training step {step}: {what} failed, above agent_flow.max_failed_share={max_failed_share:g}; stopping "
        f"instead of training on what is left. Failed: {named}.{_quoted_error(non_tensor_batch, mask)} "
        f"Raise agent_flow.max_failed_share to go on through such steps; {where}")


def _quoted_error(non_tensor_batch: dict[str, Any], mask: np.ndarray) -> str:
    """`` The most common error (N of the M failed episodes): <service>: "<error>".`` from the episodes'
    records (empty when the rows carry none)."""
    records = non_tensor_batch.get("episode_record")
    if records is None:
        return ""
    failures = non_tensor_batch[FAILURE_COLUMN]
    errors = Counter((str(failures[row]), str((records[row] or {}).get("error") or "no error recorded"))
                     for row in np.flatnonzero(mask))
    (service, error), count = errors.most_common(1)[0]
    if len(error) > _QUOTE_CHARS:
        error = error[:_QUOTE_CHARS] + " [...]"
    return (f" The most common error ({count} of the {int(mask.sum())} failed episodes): {service}: "
            f"{json.dumps(error, ensure_ascii=False)}.")


def exclude_failed(batch: Any) -> int:
    """Keep the failed rows of ``batch`` out of the update (module docstring); returns how many there were.
    Runs before the advantage stage, which then sees each failed row alone in its group."""
    mask = failed_mask(batch.non_tensor_batch)
    if not mask.size or not mask.any():
        return 0
    rows = np.flatnonzero(mask)
    batch.batch["response_mask"][rows.tolist()] = 0
    uid = np.array(batch.non_tensor_batch["uid"], dtype=object, copy=True)
    for row in rows:
        uid[row] = f"failed-{uuid.uuid4().hex}"
    batch.non_tensor_batch["uid"] = uid
    others = batch.non_tensor_batch.get("other_samples")
    if others is not None:
        for row in rows:
            others[row] = []
    return int(rows.size)
