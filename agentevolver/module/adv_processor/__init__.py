"""Self-Attributing (ADCA-GRPO): an LLM judge labels every step GOOD/BAD, and the labels reshape advantages.

Read top to bottom: :mod:`.judge_prompt` (what the judge sees and how its reply is read), :mod:`.judge`
(one request per sample, concurrently, with skips, re-asks and GRPO fallback), :mod:`.env_labels` (the same
labels from the environment service where it can give them, and the judge's agreement with them),
:mod:`.adca_grpo` (the maths: process and outcome rewards z-scored apart, fused with alpha, suffix-summed,
broadcast to tokens),
:mod:`.stage` (the trainer's ``judge`` stage and the ADCA part of its ``adv`` stage). The same maths as a
per-sample loop, the tests' oracle and the benchmark's baseline, is not part of this package:
``tools/adv_oracle.py``. The maths in full: docs/adca.md.

Attributes are imported on first access (PEP 562), so importing one module of this package (the maths in
:mod:`.adca_grpo`, which needs only torch and numpy) does not import the judge's pydantic/LLM-client stack: the
GPU kernel check (``tools/gpu_kernel_check.py``) runs it where only torch is installed.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    **dict.fromkeys(("AdcaAdvantages", "AdcaHyper", "compute_prm_grpo_advantages", "cosine_alpha",
                     "prm_grpo_advantages"), "adca_grpo"),
    **dict.fromkeys(("EnvLabelsResult", "EnvStepLabeller", "agreement_metrics", "env_step_flags"), "env_labels"),
    **dict.fromkeys(("JudgeInput", "StepFlagsResult", "evaluate_step_flags"), "judge"),
    **dict.fromkeys(("JudgeParseError", "Transcript", "build_judge_messages", "parse_step_judgments",
                     "transcript_from_record"), "judge_prompt"),
    **dict.fromkeys(("ADCA_ESTIMATOR", "AdcaStage", "StepLabels"), "stage"),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
