"""CPU backend: the batched transformers generator (docs/cpu_generator.md), its sampling and caches, and the
machine's precision, threads and allocator. torch and transformers only: its verl side (the ``hf`` rollout, the
``cpu`` platform and its engines) is :mod:`agentevolver.verl.cpu` (docs/backends.md).

Attributes are imported on first access (PEP 562): the start-up code (``main_ppo``, the launcher) imports the
precision, threads and allocator modules of this package in processes that never generate, and must not pay
for the generator's transformers import there.
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
