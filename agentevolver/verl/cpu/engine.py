"""verl's FSDP training engines, registered for device ``cpu``.

verl picks a training engine by (model type, strategy, device) in ``verl.workers.engine.EngineRegistry``;
its FSDP engines (``verl.workers.engine.fsdp.transformer_impl``) are registered for ``cuda`` and ``npu``
only, so on the ``cpu`` platform a worker fails with "No engine registered for device='cpu'". The engines
themselves are device-agnostic (they place tensors with ``get_device_name()``/``get_device_id()``, which
the ``cpu`` platform answers), and FSDP2 (``strategy: fsdp2``) shards and trains over gloo on CPU. This
module adds them under ``device="cpu"`` through verl's public ``EngineRegistry.register``: the value-head
engine as it is, the LM-head engine as its subclass ``SharedPromptFSDPEngine``
(:func:`agentevolver.verl.shared_prefix.engine.engine_class`), which is verl's engine unless a
micro-batch carries ``use_prefix_grouper`` (then each GRPO group's shared prompt is computed once).

:func:`register` imports the engine module (transformers, FSDP: about 1.5 s), so the verl plugin calls it
from an import hook when a process imports that module anyway, not at ``import verl``.
"""

from __future__ import annotations

__all__ = ["ENGINE_MODULE", "register"]

#: The verl module whose engines are registered here.
ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
_BACKENDS = ["fsdp", "fsdp2"]
_registered = False


def register() -> list[str]:
    """Register verl's FSDP LM-head (shared-prompt subclass) and value-head engines for ``cpu`` (idempotent).

    Returns the ``model_type`` keys registered by this call (empty when already registered).
    """
    global _registered
    if _registered:
        return []
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithValueHead

    from agentevolver.verl.shared_prefix.engine import engine_class

    engines = {"language_model": engine_class(), "value_model": FSDPEngineWithValueHead}
    for model_type, engine in engines.items():
        EngineRegistry.register(model_type=model_type, backend=_BACKENDS, device="cpu")(engine)
    _registered = True
    return list(engines)
