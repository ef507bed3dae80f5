"""Step labels from the environment service, and how well the LLM judge agrees with them.

Where an environment can tell a good step from a bad one itself (the ``step_labels`` capability, e.g.
``calc``: docs/env_service.md), ADCA can take its labels instead of the LLM judge's
(``attribution_driven_credit_assignment.judge.source: env``), or keep the LLM judge and measure it against
them (``judge.compare_with_env``). The small judge this project runs on a CPU (SmolLM2-135M) has no signal;
the environment's labels are exact where the environment knows what its task requires.

Each sample's episode is labelled from its ``episode_record`` (``env_type``, ``task_id`` and the messages
with their ``step`` fields; the episode's instance is released by then and not needed), one request per
sample, all concurrently. A synthetic task's episode (Self-Questioning: played on its seed's ``task_id``
with its own question) sends what was asked as ``params.task`` (``query``, and its ``ground_truth`` as
``answer``: the record's ``played_task``), so an environment that can label it does (calc does);
``judge.label_synthetic_tasks: false`` leaves it out.

As with the LLM judge, nothing here can fail a training step: a sample the
environment cannot label (environment without the capability, a synthetic task it cannot judge, a step
count that does not match the sample's step ids, a service error) keeps its plain GRPO advantage and is
counted (``adca/env/*``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentevolver.client.env_client import EnvClient, EnvClientError
from agentevolver.module.adv_processor.judge import JudgeInput, SkipType, should_skip
from agentevolver.schema.step_labels import STEP_LABELS

__all__ = ["ENV_FALLBACK_STATUSES", "EnvLabelStatus", "EnvLabelsResult", "EnvStepLabeller", "agreement_metrics",
           "env_step_flags"]

logger = logging.getLogger(__name__)

#: ``labelled``: the environment labelled every step; ``skipped`` / ``no_steps``: as for the LLM judge (not
#: asked); ``not_asked``: not wanted by the caller (comparison of samples the judge did not label); the rest
#: have no environment labels and fall back to GRPO.
EnvLabelStatus = Literal["labelled", "skipped", "no_steps", "not_asked", "no_record", "unsupported",
                         "cannot_label", "step_mismatch", "env_error"]
ENV_FALLBACK_STATUSES: frozenset[str] = frozenset({"no_record", "unsupported", "cannot_label", "step_mismatch",
                                                   "env_error"})
#: Service error codes meaning "this episode cannot be labelled here" (not a failure of the service).
_CANNOT_LABEL_CODES = frozenset({"cannot_label", "unknown_task"})


@dataclass
class EnvLabelsResult:
    """Environment labels per sample (``flags[i]`` None = none) and what it took to get them."""

    flags: list[list[bool] | None]
    status: list[EnvLabelStatus]
    requests: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """``adca/env/*`` counts per status, ``adca/env_labelled_steps``, the GOOD share, wall time."""
        counts = Counter(self.status)
        unlabelled = sum(counts[s] for s in ENV_FALLBACK_STATUSES)
        asked = len(self.status) - counts["not_asked"] - counts["no_steps"] - counts["skipped"]
        steps = [flag for flags, status in zip(self.flags, self.status, strict=True) if status == "labelled"
                 for flag in flags or []]
        return {
            "adca/env_labelled_steps": float(len(steps)),
            "adca/env/labelled_samples": float(counts["labelled"]),
            "adca/env/unlabelled_samples": float(unlabelled),
            "adca/env/unlabelled_rate": unlabelled / asked if asked else 0.0,
            "adca/env/skipped": float(counts["skipped"]),
            "adca/env/no_steps": float(counts["no_steps"]),
            "adca/env/no_record": float(counts["no_record"]),
            "adca/env/unsupported": float(counts["unsupported"]),
            "adca/env/cannot_label": float(counts["cannot_label"]),
            "adca/env/step_mismatch": float(counts["step_mismatch"]),
            "adca/env/errors": float(counts["env_error"]),
            "adca/env/requests": float(self.requests),
            "adca/env/good_share": sum(steps) / len(steps) if steps else 0.0,
            "adca/env/time_s": self.elapsed_s,
        }


class EnvStepLabeller:
    """Asks the environment service for step labels; remembers which environments offer them.

    ``client`` is the trainer's environment client (built from the ``env_service`` section when None, on
    first use, so a stage that never asks needs no service). A capability answer is remembered for the
    run; an unreachable service is asked again next time. ``label_synthetic_tasks``
    (``judge.label_synthetic_tasks``) False leaves a synthetic task's question and answer out of the request.
    """

    def __init__(self, env_section: Any, client: EnvClient | None = None, *, label_synthetic_tasks: bool = True) -> None:
        self._section = env_section
        self._label_synthetic_tasks = label_synthetic_tasks
        self._client = client
        self._owns_client = client is None
        self._capable: dict[str, bool] = {}
        self._warned: set[str] = set()

    @property
    def client(self) -> EnvClient:
        if self._client is None:
            self._client = EnvClient.from_config(self._section)
        return self._client

    def close(self) -> None:
        """Close the client's pools (only a client this labeller built)."""
        if self._owns_client and self._client is not None:
            self._client.close()

    def offers_labels(self, env_types: Sequence[str]) -> dict[str, bool | None]:
        """Per environment: True / False = it does / does not offer ``step_labels``; None = the service could
        not say (unreachable; a single quick health check, no retries, so a missing service costs nothing)."""
        answer: dict[str, bool | None] = {}
        unknown = [env for env in dict.fromkeys(env_types) if env not in self._capable]
        healthy = not unknown or self.client.healthy()
        for env in dict.fromkeys(env_types):
            if env in self._capable:
                answer[env] = self._capable[env]
                continue
            if not healthy:
                answer[env] = None
                continue
            try:
                self._capable[env] = answer[env] = STEP_LABELS in self.client.capabilities(env)
            except EnvClientError as err:
                self.warn_once(f"capabilities:{env}", "cannot ask the environment service whether %r offers "
                               "step labels: %s", env, err)
                answer[env] = None
        return answer

    def warn_once(self, key: str, message: str, *args: Any) -> None:
        """A warning the first time ``key`` comes up, then debug lines (one per training step would drown
        the log)."""
        if key in self._warned:
            logger.debug(message, *args)
        else:
            self._warned.add(key)
            logger.warning(message, *args)

    async def fetch(self, records: Sequence[Mapping[str, Any] | None], num_steps: Sequence[int],
                    wanted: Sequence[bool], offered: Mapping[str, bool | None]) -> EnvLabelsResult:
        """Labels for the samples ``wanted`` (concurrently; the rest are ``not_asked``), from an environment
        that ``offered`` them (see :meth:`offers_labels`). Never raises for service failures."""
        started = time.perf_counter()
        result = EnvLabelsResult(flags=[None] * len(records), status=["not_asked"] * len(records))
        jobs: list[tuple[int, Mapping[str, Any]]] = []
        for index, (record, count, want) in enumerate(zip(records, num_steps, wanted, strict=True)):
            if not want:
                continue
            if count == 0:
                result.flags[index], result.status[index] = [], "no_steps"
            elif record is None or not record.get("messages") or not record.get("env_type") \
                    or not record.get("task_id"):
                result.status[index] = "no_record"
            else:
                capable = offered.get(str(record["env_type"]))
                if capable is None:
                    result.status[index] = "env_error"
                elif not capable:
                    result.status[index] = "unsupported"
                else:
                    jobs.append((index, record))
        try:
            answers = await asyncio.gather(*(self._one(record, num_steps[index]) for index, record in jobs))
        finally:
            if self._owns_client and jobs:  # this loop's pool dies with the loop (run_coroutine): close it now
                await self.client.aclose()
        for (index, _), (flags, status, error) in zip(jobs, answers, strict=True):
            result.flags[index], result.status[index] = flags, status
            if error:
                result.errors.append(f"sample {index}: {error}")
        result.requests = len(jobs)
        result.elapsed_s = time.perf_counter() - started
        if result.errors:
            self.warn_once("fetch", "environment step labels: %d of %d sample(s) have none; first problem: %s",
                           len(result.errors), len(jobs), result.errors[0])
        return result

    async def _one(self, record: Mapping[str, Any], count: int) -> tuple[list[bool] | None, EnvLabelStatus, str | None]:
        played = record.get("played_task") if self._label_synthetic_tasks else None
        params = {"task": {"query": played.get("query"), "answer": played.get("ground_truth")}} if played else None
        try:
            data = await self.client.astep_labels(str(record["env_type"]), str(record["task_id"]), record["messages"],
                                                  params)
        except EnvClientError as err:
            if err.code == "capability_unsupported":
                self._capable[str(record["env_type"])] = False
                return None, "unsupported", None
            if err.code in _CANNOT_LABEL_CODES:
                return None, "cannot_label", str(err)
            return None, "env_error", str(err)
        except Exception as err:  # a malformed answer or anything unexpected: never fatal
            return None, "env_error", f"{type(err).__name__}: {err}"
        if len(data.labels) != count:
            return None, "step_mismatch", (f"the environment labelled {len(data.labels)} step(s), the sample's step "
                                           f"ids have {count}")
        return data.flags, "labelled", None


async def env_step_flags(inputs: Sequence[JudgeInput], records: Sequence[Mapping[str, Any] | None],
                         labeller: EnvStepLabeller, offered: Mapping[str, bool | None], *,
                         skip_type: SkipType = "none", small_adv_threshold: float = 1e-8) -> EnvLabelsResult:
    """ADCA's labels taken from the environment (``judge.source: env``): what
    :func:`~.judge.evaluate_step_flags` does with the LLM, with the same skips (a skipped sample is labelled
    all GOOD if its outcome is > 0, else all BAD) and no LLM call."""
    skipped = [item.num_steps > 0 and should_skip(item, skip_type, small_adv_threshold) for item in inputs]
    result = await labeller.fetch(records, [item.num_steps for item in inputs], [not s for s in skipped], offered)
    for index, (item, skip) in enumerate(zip(inputs, skipped, strict=True)):
        if skip:
            result.flags[index], result.status[index] = [item.outcome > 0] * item.num_steps, "skipped"
    return result


def agreement_metrics(llm_flags: Sequence[list[bool] | None], env: EnvLabelsResult) -> dict[str, float]:
    """How often the LLM judge's labels equal the environment's, over the steps both labelled.

    ``adca/judge_env_agreement`` (share of those steps; absent when there were none, so a dashboard never
    plots a made-up 0 or 1), ``adca/judge_env/compared_steps`` / ``compared_samples``, and the two kinds of
    disagreement: ``llm_good_env_bad`` (the judge praised a step the environment calls BAD) and
    ``llm_bad_env_good``.
    """
    compared = samples = agree = good_bad = bad_good = 0
    for mine, theirs, status in zip(llm_flags, env.flags, env.status, strict=True):
        if mine is None or theirs is None or status != "labelled" or len(mine) != len(theirs):
            continue
        samples += 1
        for a, b in zip(mine, theirs, strict=True):
            compared += 1
            agree += a == b
            good_bad += a and not b
            bad_good += b and not a
    metrics = {"adca/judge_env/compared_steps": float(compared), "adca/judge_env/compared_samples": float(samples),
               "adca/judge_env/llm_good_env_bad": float(good_bad), "adca/judge_env/llm_bad_env_good": float(bad_good)}
    if compared:
        metrics["adca/judge_env_agreement"] = agree / compared
    return metrics
