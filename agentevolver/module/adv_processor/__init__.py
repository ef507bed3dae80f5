"""Self-Attributing (ADCA-GRPO): an LLM judge labels every step GOOD/BAD, and the labels reshape advantages.

Read top to bottom: :mod:`.judge_prompt` (what the judge sees and how its reply is read), :mod:`.judge`
(one request per sample, concurrently, with skips, re-asks and GRPO fallback), :mod:`.env_labels` (the same
labels from the environment service where it can give them, and the judge's agreement with them),
:mod:`.adca_grpo` (the maths: process and outcome rewards z-scored apart, fused with alpha, suffix-summed,
broadcast to tokens),
:mod:`.stage` (the trainer's ``judge`` stage and the ADCA part of its ``adv`` stage). :mod:`.naive` is the same maths as a per-sample loop, kept
as the tests' oracle and the benchmark's baseline. The maths in full: docs/adca.md.
"""

from agentevolver.module.adv_processor.adca_grpo import (
    AdcaAdvantages,
    AdcaHyper,
    compute_prm_grpo_advantages,
    cosine_alpha,
    prm_grpo_advantages,
)
from agentevolver.module.adv_processor.env_labels import (
    EnvLabelsResult,
    EnvStepLabeller,
    agreement_metrics,
    env_step_flags,
)
from agentevolver.module.adv_processor.judge import JudgeInput, StepFlagsResult, evaluate_step_flags
from agentevolver.module.adv_processor.judge_prompt import (
    JudgeParseError,
    Transcript,
    build_judge_messages,
    parse_step_judgments,
    transcript_from_record,
)
from agentevolver.module.adv_processor.stage import ADCA_ESTIMATOR, AdcaStage, StepLabels

__all__ = [
    "ADCA_ESTIMATOR",
    "AdcaAdvantages",
    "AdcaHyper",
    "AdcaStage",
    "EnvLabelsResult",
    "EnvStepLabeller",
    "JudgeInput",
    "JudgeParseError",
    "StepFlagsResult",
    "StepLabels",
    "Transcript",
    "agreement_metrics",
    "build_judge_messages",
    "compute_prm_grpo_advantages",
    "cosine_alpha",
    "env_step_flags",
    "evaluate_step_flags",
    "parse_step_judgments",
    "prm_grpo_advantages",
    "transcript_from_record",
]
