"""Shared-prompt training for GRPO groups: each group's prompt is computed once per forward/backward.

* :mod:`.layout`: the grouped layout and the forward (torch + transformers only; tests and benchmarks use it
  on a bare model);
* :mod:`.engine`: verl's FSDP LM-head engine taking that forward for micro-batches that ask for it (imports
  verl's engine module, so it is not imported here).
"""

from agentevolver.verl.shared_prefix.layout import (
    SUPPORTED_ATTENTION,
    SWITCH,
    SharedPrefixPlan,
    check_attention,
    model_inputs,
    plan_groups,
    response_logprobs,
    response_outputs,
    sequences_from_padded,
    shared_forward,
    unshared_forward,
)

__all__ = [
    "SUPPORTED_ATTENTION",
    "SWITCH",
    "SharedPrefixPlan",
    "check_attention",
    "model_inputs",
    "plan_groups",
    "response_logprobs",
    "response_outputs",
    "sequences_from_padded",
    "shared_forward",
    "unshared_forward",
]
