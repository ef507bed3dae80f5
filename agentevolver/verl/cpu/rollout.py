"""verl rollout ``hf``: an :class:`~agentevolver.backends.cpu.HFGenerator` behind verl's rollout-server interface.

verl's trainer generates through rollout *replicas* (``verl.workers.rollout.replica``), each fronting one
or more *server* Ray actors that agent loops call with ``generate(request_id, prompt_ids, sampling_params)``
and that the trainer drives through a lifecycle (``wake_up``/``sleep``, abort/resume, KV-cache release).
On GPU those are vLLM/SGLang servers. With ``actor_rollout_ref.rollout.name=hf`` they are:

* :class:`HFRolloutServer` - a Ray actor holding one ``HFGenerator`` (transformers model, SDPA, batched
  decode). Lifecycle calls are no-ops where vLLM frees GPU memory (CPU memory is not shared with the
  trainer); abort/resume really abort and park requests. It lives in :mod:`.rollout_server`, which imports
  nothing heavy at the top: every process holding a handle to it imports its class's module.
* :class:`HFReplica` - a ``RolloutReplica`` that starts one server per replica on the node of its worker, or,
  where the TaskRunner gave the worker the class that can (``trainer.rollout_server``, :mod:`.hosting`), has the
  worker build it in its own process. Registered as ``hf`` in ``RolloutReplicaRegistry``.
* :class:`HFServerAdapter` - the worker-side ``BaseRollout`` (registered for ``("hf", "async")``). It lives
  in the training worker and receives the actor's weights on every sync.

Weight sync (``checkpoint_engine.backend=naive``, the only backend for ``hf``): the trainer's
``CheckpointEngineManager.update_weights`` calls ``ActorRolloutRefWorker.update_weights``, which streams
``engine.get_per_tensor_param()`` (full tensors gathered from FSDP; a collective, so every rank iterates)
into :meth:`HFServerAdapter.update_weights`. The leader rank sends them to its server in buckets of
``checkpoint_engine.update_weights_bucket_megabytes``; the server copies them into the model in place and,
at the end, checks that every model parameter was written, so after the sync the server's model equals the
actor's. A LoRA actor (``actor_rollout_ref.model.lora_rank > 0``) sends either merged weights, which load the
same way, or its adapters, which the server merges into the weights it serves (:mod:`.lora`).

Other differences from verl's vLLM server: one server per replica (tensor/pipeline/data parallel sizes must
be 1), weights always load from ``model.path`` at start (``load_format`` is ignored), there is no HTTP
endpoint (the replica's "address" is the server's Ray actor name), ``rollout.dtype`` picks the model dtype
(use ``float32`` on CPU so rollout and trainer log-probs agree), and ``rollout.engine_kwargs.hf`` is passed to
``HFGenerator`` (``max_batch_size``, ``batch_wait_s``, ``prefix_cache_entries``, ``turn_cache_mb``, ``chunk_cache_mb``, ``continuous_batching``,
``join_free_rows``: how many free rows a running batch waits for before requests join it;
``batch_invariant_greedy``: greedy validation that timing cannot change; ``draft_tokens``: speculative decoding with
prompt-lookup drafts; ``seed``: replica ``r`` samples with seed + ``r``,
default ``rollout.seed``). Like vLLM, a missing ``max_tokens`` means
``min(response_length, prompt_length + response_length - len(prompt))``, clamped to the context, and both
EOS and length stops report ``stop_reason="completed"``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterable, Iterable
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica

from agentevolver.verl.cpu.rollout_server import (
    ROLLOUT_NAME,
    HFRolloutServer,
    HostedServerHandle,
    InProcessServer,
    dtype_name,
    hosted_server,
    remember,
    server_actor_name,
)

__all__ = ["ROLLOUT_NAME", "HFReplica", "HFRolloutServer", "HFServerAdapter", "server_actor_name"]

logger = logging.getLogger(__name__)



def _check_single_process(config: RolloutConfig) -> None:
    sizes = {
        "tensor_model_parallel_size": config.tensor_model_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "pipeline_model_parallel_size": config.pipeline_model_parallel_size,
    }
    wrong = {key: value for key, value in sizes.items() if value != 1}
    if wrong:
        settings = ", ".join(f"actor_rollout_ref.rollout.{key}={value}" for key, value in wrong.items())
        raise ValueError(
            f"rollout.name=hf runs one model copy per replica; set {settings} to 1 "
            "(config/backend/cpu.yaml does)"
        )


class HFReplica(RolloutReplica):
    """A rollout replica of one :class:`HFRolloutServer`, placed on the node of the replica's worker."""

    async def launch_servers(self) -> None:
        _check_single_process(self.config)
        assert len(self.workers) == self.world_size == 1, f"expected 1 worker, got {len(self.workers)}"
        node_id = await self.workers[0].__ray_call__.remote(lambda worker: ray.get_runtime_context().get_node_id())
        if self.is_reward_model:
            name = server_actor_name(self.replica_rank, f"_reward{self.name_suffix}")
        elif self.is_teacher_model:
            name = server_actor_name(self.replica_rank, f"_teacher{self.name_suffix}")
        else:
            name = server_actor_name(self.replica_rank, self.name_suffix)
        worker = self.workers[0]
        if self._hosted_by(worker):
            info = await worker.start_hf_server.remote(name, self.config, self.model_config, self.rollout_mode,
                                                       self.replica_rank)
            logger.info("hf rollout server %s hosted in the training worker %s: %s", name, info["worker_name"], info)
            self.servers = [HostedServerHandle(info["worker_name"], info["namespace"], name)]
            remember(self.servers[0])
            self._server_handle = self.servers[0]
            self._server_address = name
            return
        from agentevolver.verl import prestart

        # started with the training workers (trainer.prestart) if it was created from these very arguments
        server = prestart.take_server(name, prestart.server_key(self.config, self.model_config, self.rollout_mode,
                                                                self.replica_rank, node_id))
        if server is None:
            server = (
                ray.remote(HFRolloutServer)
                .options(
                    name=name,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                    max_concurrency=self.max_concurrency,
                )
                .remote(
                    config=self.config,
                    model_config=self.model_config,
                    rollout_mode=self.rollout_mode,
                    replica_rank=self.replica_rank,
                )
            )
        info = await server.ready.remote()
        logger.info("hf rollout server %s ready: %s", name, info)
        self.servers = [server]
        self._server_handle = server
        self._server_address = name


    def _hosted_by(self, worker: Any) -> bool:
        """Whether ``worker`` hosts this replica's server (:mod:`.hosting`): a policy replica fused into a
        worker of the class that can (the TaskRunner picked it for ``trainer.rollout_server``)."""
        from verl.workers.rollout.replica import RolloutMode

        if self.is_reward_model or self.is_teacher_model or self.rollout_mode != RolloutMode.HYBRID:
            return False
        return hasattr(worker, "start_hf_server")


class HFServerAdapter(BaseRollout):
    """Worker-side rollout for ``hf`` (in the training worker): pushes the actor's weights to the server.

    Args:
        config: the rollout config.
        model_config: the model config.
        device_mesh: unused (one model copy per replica).
        replica_rank: the replica of this worker; -1 = derived from the worker's ``RANK``.
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_config: HFModelConfig,
        device_mesh: Any = None,
        replica_rank: int = -1,
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        _check_single_process(self.config)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank if replica_rank == -1 else replica_rank
        self.is_leader_rank = True  # one worker per replica: every worker feeds its own server
        self._server: Any = None
        self._bucket_bytes = max(1, int(self.config.checkpoint_engine.update_weights_bucket_megabytes)) << 20
        # full weights travel in the server's dtype: the server's in-place copy would round them to it anyway (the
        # same rounding), and a bf16 server then receives half the bytes of the actor's fp32 master weights
        self._wire_dtype = getattr(torch, dtype_name(self.config.dtype))

    @property
    def server(self) -> Any:
        """The replica's server: the one this worker hosts, else its actor, looked up by name (it starts after the
        workers)."""
        if self._server is None:
            name = server_actor_name(self.replica_rank)
            hosted = hosted_server(name)  # built in this worker (trainer.rollout_server=worker)
            self._server = InProcessServer(hosted) if hosted is not None else ray.get_actor(name)
        return self._server

    async def resume(self, tags: list[str]) -> None:
        await self.server.wake_up.remote(tags=tags)

    async def release(self) -> None:
        await self.server.sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterable[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        peft_config: dict[str, Any] | None = None,
        base_sync_done: bool = True,
        **kwargs: Any,
    ) -> None:
        """Send every ``(name, tensor)`` to the server in buckets; the server checks that all arrived.

        With ``peft_config`` (a LoRA actor, ``model.lora.merge=false``) verl sends either the base model
        (``base_sync_done=False``: the first sync of a rollout started on dummy weights) or the adapters, which
        the server merges into the weights it serves. Without it: full weights (full fine-tuning, or LoRA merged
        by the trainer).
        """
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"rollout.name=hf takes full tensors (checkpoint_engine.backend=naive); got wire_format={wire_format!r}"
            )
        adapters = peft_config is not None and base_sync_done
        server = self.server
        await server.begin_weight_update.remote("adapters" if adapters else "weights")
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0

        async def flush() -> None:
            if adapters:
                await server.load_lora_adapter.remote(bucket, dict(peft_config))
            else:
                await server.load_weights.remote(bucket)

        async for name, tensor in _iterate(weights):
            tensor = tensor.detach().to("cpu")
            if peft_config is None and tensor.is_floating_point():
                # LoRA's base weights and adapters keep the actor's precision: the server merges them
                tensor = tensor.to(self._wire_dtype)
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self._bucket_bytes:
                await flush()
                bucket, size = [], 0
        if bucket:
            await flush()
        await server.finish_weight_update.remote(global_steps)


async def _iterate(items: Iterable[Any] | AsyncIterable[Any]):
    if hasattr(items, "__aiter__"):
        async for item in items:  # type: ignore[union-attr]
            yield item
    else:
        for item in items:  # type: ignore[union-attr]
            yield item
