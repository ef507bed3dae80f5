"""CPU backend: the batched transformers generator (docs/cpu_generator.md), and its verl side: the ``hf`` verl
rollout (:mod:`.verl_rollout`), the ``cpu`` verl platform (:mod:`.verl_platform`) and its FSDP engines
(:mod:`.verl_engine`) (docs/backends.md).

Attributes are imported on first access (PEP 562): verl's plugin imports submodules of this package inside
``import verl`` in every process, and must not pay for the generator's torch/transformers/verl imports there.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["GenerationError", "GeneratorClosedError", "HFGenerator", "SamplingSettings", "parse_sampling_params"]

_WHERE = {
    "GenerationError": "agentevolver.backends.cpu.generator",
    "GeneratorClosedError": "agentevolver.backends.cpu.generator",
    "HFGenerator": "agentevolver.backends.cpu.generator",
    "SamplingSettings": "agentevolver.backends.cpu.sampling",
    "parse_sampling_params": "agentevolver.backends.cpu.sampling",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
