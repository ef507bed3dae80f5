"""verl's vLLM rollout on a CPU-only machine: the engine-worker extension of the ``vllm_cpu`` backend preset.

verl's vLLM server (``vLLMHttpServer``) starts vLLM with ``worker_extension_cls`` =
``verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension``, the class that receives the actor's
weights in vLLM's engine worker (``update_weights_from_ipc``). ``rollout.engine_kwargs.vllm`` is merged over
verl's arguments, so ``config/backend/vllm_cpu.yaml`` names :class:`CPUWorkerExtension` there instead: verl's
extension unchanged, plus patch 4 of :mod:`agentevolver.verl.patches` installed in the worker process before
vLLM loads the model. Without it, vLLM's CPU linear layers drop their unpacked weights at load time and the
first weight sync fails inside vLLM ("'Parameter' object has no attribute 'weight_loader'").

The class is resolved by vLLM in its worker process (``WorkerWrapperBase.init_worker``), which also loads
this project's verl plugin (through ``import verl``), and is mixed into vLLM's ``CPUWorker`` as an extra base;
its ``__new__`` runs when the worker is built, before ``load_model``.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

__all__ = ["WORKER_EXTENSION", "CPUWorkerExtension"]

#: The dotted name the preset sets as ``rollout.engine_kwargs.vllm.worker_extension_cls``.
WORKER_EXTENSION = "agentevolver.verl.cpu.vllm.CPUWorkerExtension"


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's colocated worker extension, with vLLM's CPU linear layers kept reloadable (patch 4)."""

    def __new__(cls, **kwargs: Any):
        from agentevolver.verl import patches

        # raises VerlChangedError (naming patch 4 and the vLLM version) if vLLM or verl changed
        patches.apply_vllm_cpu_linear()
        return super().__new__(cls, **kwargs)
