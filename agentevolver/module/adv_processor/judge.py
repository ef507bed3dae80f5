"""Step labels from the judge LLM: one request per sample, all samples concurrently, never failing a step.

The judge is the ``judge`` LLM role (an OpenAI-compatible endpoint from ``llm.endpoints``); the shared
:class:`~agentevolver.client.llm_client.LLMClient` supplies the per-request timeout, the transport retries
with full-jitter backoff (timeouts, connection errors, 429, 5xx, malformed 200s) and the limit on requests in
flight (``max_concurrency``, per event loop). This module adds what is specific to judging: which samples
are worth a request (``skip_type``), one prompt per sample with all its steps, reading the labels back, and
re-asking (``judge.parse_retries``, same backoff) when a reply cannot be read. Where the endpoint takes
``response_format`` (``llm.endpoints.<name>.structured_output``), the reply's schema (exactly one GOOD/BAD
per step) is sent with the request and the prompt asks for that JSON, so replies always parse.

No outcome of the judge can fail the training step: a sample whose labels cannot be obtained (transport
failure after retries, an unreadable reply after re-asks, no transcript) gets ``None`` and keeps its plain
GRPO advantage; it is counted in ``adca/judge/fallback``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from agentevolver.client.llm_client import LLMClient
from agentevolver.client.retry import FullJitterBackoff
from agentevolver.module.adv_processor.judge_prompt import (
    JudgeParseError,
    Transcript,
    build_judge_messages,
    judgment_schema,
    parse_step_judgments,
)

__all__ = ["FALLBACK_STATUSES", "JudgeInput", "SampleStatus", "StepFlagsResult", "evaluate_step_flags",
           "should_skip"]

logger = logging.getLogger(__name__)

SkipType = Literal["none", "skip_small_adv", "skip_all_neg"]
#: ``judged``: labelled by the judge; ``skipped``: not sent (skip_type), labelled all GOOD if its outcome is
#: > 0 else all BAD; ``no_steps``: no step tokens, nothing to label; the rest fall back to GRPO.
SampleStatus = Literal["judged", "skipped", "no_steps", "no_transcript", "judge_error", "unparseable"]
FALLBACK_STATUSES: frozenset[str] = frozenset({"no_transcript", "judge_error", "unparseable"})


@dataclass(frozen=True)
class JudgeInput:
    """What the judge stage needs of one sample."""

    num_steps: int
    outcome: float
    grpo_advantage: float
    success: bool
    transcript: Transcript | None


@dataclass
class StepFlagsResult:
    """Labels (``flags[i]`` None = fall back to GRPO) and what it took to get them."""

    flags: list[list[bool] | None]
    status: list[SampleStatus]
    parse_retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    structured_replies: int = 0

    def metrics(self) -> dict[str, float]:
        """``adca/judge/*``: counts per status, requests sent, fallback rate, retries, tokens, wall time."""
        counts = Counter(self.status)
        fallback = sum(counts[s] for s in FALLBACK_STATUSES)
        with_steps = len(self.status) - counts["no_steps"]
        requests = counts["judged"] + counts["judge_error"] + counts["unparseable"]
        return {
            "adca/judge/requests": float(requests),
            "adca/judge/judged": float(counts["judged"]),
            "adca/judge/skipped": float(counts["skipped"]),
            "adca/judge/no_steps": float(counts["no_steps"]),
            "adca/judge/fallback": float(fallback),
            "adca/judge/fallback_rate": fallback / with_steps if with_steps else 0.0,
            "adca/judge/errors": float(counts["judge_error"]),
            "adca/judge/unparseable": float(counts["unparseable"]),
            "adca/judge/parse_retries": float(self.parse_retries),
            "adca/judge/structured_replies": float(self.structured_replies),
            "adca/judge/prompt_tokens": float(self.prompt_tokens),
            "adca/judge/completion_tokens": float(self.completion_tokens),
            "adca/judge/time_s": self.elapsed_s,
        }


def should_skip(item: JudgeInput, skip_type: SkipType, small_adv_threshold: float) -> bool:
    """``skip_small_adv``: |GRPO advantage| below the threshold (e.g. a group whose samples all scored
    alike, whose GRPO advantage is 0); ``skip_all_neg``: outcome <= 0 (only successes are judged)."""
    if skip_type == "skip_small_adv":
        return abs(item.grpo_advantage) < small_adv_threshold
    if skip_type == "skip_all_neg":
        return item.outcome <= 0
    return False


@dataclass
class _Answer:
    flags: list[bool] | None
    status: SampleStatus
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    structured: int = 0


async def evaluate_step_flags(
    inputs: Sequence[JudgeInput],
    client: LLMClient,
    *,
    skip_type: SkipType = "none",
    small_adv_threshold: float = 1e-8,
    parse_retries: int = 1,
) -> StepFlagsResult:
    """Label every step of every sample that needs it: one judge request per non-skipped sample.

    Requests run concurrently (the client caps how many are in flight). Never raises for judge failures:
    see the module docstring.
    """
    started = time.perf_counter()
    flags: list[list[bool] | None] = [None] * len(inputs)
    status: list[SampleStatus] = ["no_transcript"] * len(inputs)
    to_ask: list[int] = []
    for index, item in enumerate(inputs):
        if item.num_steps == 0:
            flags[index], status[index] = [], "no_steps"
        elif should_skip(item, skip_type, small_adv_threshold):
            flags[index], status[index] = [item.outcome > 0] * item.num_steps, "skipped"
        elif item.transcript is not None and len(item.transcript.steps) == item.num_steps:
            to_ask.append(index)
    answers = await asyncio.gather(*(_judge(client, inputs[i], parse_retries) for i in to_ask))
    result = StepFlagsResult(flags=flags, status=status)
    for index, answer in zip(to_ask, answers, strict=True):
        flags[index], status[index] = answer.flags, answer.status
        result.parse_retries += answer.retries
        result.prompt_tokens += answer.prompt_tokens
        result.completion_tokens += answer.completion_tokens
        result.structured_replies += answer.structured
        if answer.error:
            result.errors.append(f"sample {index}: {answer.error}")
    result.elapsed_s = time.perf_counter() - started
    if result.errors:
        logger.warning("ADCA judge: %d of %d sample(s) keep their GRPO advantage; first problem: %s",
                       len(result.errors), len(to_ask), result.errors[0])
    return result


async def _judge(client: LLMClient, item: JudgeInput, parse_retries: int) -> _Answer:
    """One sample: ask, read the labels, re-ask (with backoff) while the reply is unreadable."""
    assert item.transcript is not None
    structured = client.structured_kind is not None
    messages = build_judge_messages(item.transcript, outcome=item.outcome, success=item.success, structured=structured)
    schema = judgment_schema(item.num_steps) if structured else None
    endpoint = client.endpoint
    answer = _Answer(flags=None, status="unparseable")
    retrying = AsyncRetrying(
        stop=stop_after_attempt(parse_retries + 1),
        wait=FullJitterBackoff(endpoint.backoff_initial_s, endpoint.backoff_max_s),
        retry=retry_if_exception_type(JudgeParseError),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                answer.retries = attempt.retry_state.attempt_number - 1
                reply = await client.achat(messages, schema=schema)
                answer.structured += reply.structured is not None
                answer.prompt_tokens += reply.usage.prompt_tokens
                answer.completion_tokens += reply.usage.completion_tokens
                answer.flags = parse_step_judgments(reply.text, item.num_steps)
                answer.status = "judged"
    except JudgeParseError as err:
        answer.flags, answer.status, answer.error = None, "unparseable", f"unreadable reply: {err}"
    except Exception as err:  # LLMError after the client's retries, or anything unexpected: never fatal
        answer.flags, answer.status, answer.error = None, "judge_error", f"{type(err).__name__}: {err}"
    return answer
