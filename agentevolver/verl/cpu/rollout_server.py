"""The ``hf`` rollout server, :class:`HFRolloutServer`: the Ray actor behind verl's rollout-server calls
(:mod:`agentevolver.verl.cpu.rollout` has the replica that starts it and the worker-side adapter).

Its own module, importing torch, transformers and verl only inside its methods, because every process that
receives a handle to the server imports the module of its class (Ray reads the actor's methods from it):
verl's request router and the agent-loop workers hold such handles. In ``rollout.py`` it cost the router
process ~5 CPU seconds of imports per run (bench/startup_profile.py's CPU table).

The same server object can instead live in the training worker's process (``trainer.rollout_server=worker``,
:mod:`.hosting`): :class:`HostedServerHandle` stands for it where verl holds an actor handle, and
:func:`server_handle` finds a server by name in either place.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode, TokenOutput

    from agentevolver.backends.cpu.generator import HFGenerator

__all__ = ["ROLLOUT_NAME", "HFRolloutServer", "HostedServerHandle", "InProcessServer", "host", "hosted_server",
           "remember", "server_actor_name", "server_handle"]

logger = logging.getLogger(__name__)

#: ``actor_rollout_ref.rollout.name`` of this backend.
ROLLOUT_NAME = "hf"


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    """Ray actor name of the server of replica ``replica_rank`` (the adapter finds its server by it)."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}_0{name_suffix}"


#: The servers hosted in this process (a training worker's, ``trainer.rollout_server=worker``), by server name.
_hosted: dict[str, HFRolloutServer] = {}


def host(name: str, server: HFRolloutServer) -> None:
    """Keep ``server`` in this process under ``name`` (the training worker that built it serves its calls)."""
    _hosted[name] = server


def hosted_server(name: str) -> HFRolloutServer | None:
    """The server called ``name`` hosted in this process, else None (it is a Ray actor of its own)."""
    return _hosted.get(name)


#: Handles of the servers hosted in training workers, by server name, in the process whose replicas started them.
_handles: dict[str, HostedServerHandle] = {}


def remember(handle: HostedServerHandle) -> None:
    """Record the handle of a hosted server, for :func:`server_handle` in this process."""
    _handles[handle.server_name] = handle


def server_handle(name: str) -> Any:
    """The server called ``name`` (e.g. ``server_actor_name(0)``), callable as ``await h.status.remote()``
    wherever it runs: hosted in this process (the training worker), hosted in a worker and started by a replica
    of this process (the TaskRunner's: the driver by default, where in-process agent loops and custom reward
    functions run), else the Ray actor of that name (``trainer.rollout_server=actor``).

    Raises:
        ValueError: no such server is known here (Ray's error for an unknown actor name).
    """
    import ray

    hosted = hosted_server(name)
    if hosted is not None:
        return InProcessServer(hosted)
    if name in _handles:
        return _handles[name]
    return ray.get_actor(name)


class HostedServerHandle:
    """What stands for a server hosted in a training worker wherever verl holds a server's actor handle: the
    replica's ``servers``, the request router, the agent loops. ``handle.generate.remote(...)`` calls the
    worker's ``hf_server_call`` (:mod:`agentevolver.verl.cpu.hosting_worker`) and returns its object ref, as an
    actor method's ``.remote`` does.

    It holds the worker's actor *name*, not its handle, and looks the actor up when called (once per process):
    unpickling a handle imports the module of the actor's class (verl's, which imports torch), and the request
    router only passes handles on; only the processes that call it (which have imported verl) resolve it.
    """

    def __init__(self, worker_name: str, namespace: str | None, server_name: str) -> None:
        self.worker_name = worker_name
        self.namespace = namespace
        self.server_name = server_name

    def __getattr__(self, method: str) -> _HostedMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _HostedMethod(self, method)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        worker = _worker_actor(self.worker_name, self.namespace)
        return worker.hf_server_call.remote(self.server_name, method, *args, **kwargs)

    def __repr__(self) -> str:
        return f"HostedServerHandle({self.server_name!r} in {self.worker_name!r})"


#: Worker actor handles looked up in this process, by (name, namespace): the request router hands out a fresh
#: copy of a server's handle for every request, and a name lookup is a blocking round trip to Ray's GCS.
_workers: dict[tuple[str, str | None], Any] = {}


def _worker_actor(name: str, namespace: str | None) -> Any:
    if (name, namespace) not in _workers:
        import ray

        _workers[name, namespace] = ray.get_actor(name, namespace=namespace)
    return _workers[name, namespace]


class _HostedMethod:
    """``handle.method``: ``.remote(*args, **kwargs)`` runs it on the hosted server; returns an object ref."""

    def __init__(self, handle: HostedServerHandle, method: str) -> None:
        self._handle = handle
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle._call(self._method, *args, **kwargs)


class InProcessServer:
    """A server hosted in this process called as its actor would be, ``await server.method.remote(...)``, so the
    worker-side adapter has one code path for both (the coroutine runs on the caller's event loop)."""

    def __init__(self, server: HFRolloutServer) -> None:
        self._server = server

    def __getattr__(self, method: str) -> _InProcessMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _InProcessMethod(getattr(self._server, method))


class _InProcessMethod:
    def __init__(self, bound: Any) -> None:
        self._bound = bound

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._bound(*args, **kwargs)


def dtype_name(dtype: Any) -> str:
    """``rollout.dtype`` as the generator's dtype name (``auto`` resolved by the CPU's bf16 speed)."""
    import torch
    from verl.utils.torch_dtypes import PrecisionType

    from agentevolver.backends.cpu.precision import resolve_dtype

    dtype_names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    torch_dtype = dtype
    if isinstance(dtype, str):  # "auto" (resolved by main_ppo; here too for servers started without it)
        try:
            torch_dtype = PrecisionType.to_dtype(resolve_dtype(dtype))
        except RuntimeError:  # verl: "unexpected precision"
            torch_dtype = None
    if torch_dtype not in dtype_names:
        raise ValueError(f"rollout.dtype must be auto, float32, bfloat16 or float16 for rollout.name=hf; "
                         f"got {dtype!r}")
    return dtype_names[torch_dtype]


class HFRolloutServer:
    """Ray actor (created by :class:`HFReplica`): verl's rollout-server calls over one ``HFGenerator``.

    Args:
        config: the rollout config (``actor_rollout_ref.rollout``).
        model_config: the model config (``actor_rollout_ref.model``).
        rollout_mode: how the replica runs next to the trainer (hybrid for the PPO trainer).
        replica_rank: the replica this server belongs to.
    """

    def __init__(
        self,
        config: RolloutConfig | Any,
        model_config: HFModelConfig | Any,
        rollout_mode: RolloutMode,
        replica_rank: int,
    ) -> None:
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import HFModelConfig, RolloutConfig

        from agentevolver.backends.cpu.generator import HFGenerator
        from agentevolver.verl.cpu.lora import AdapterMerger

        self.config: RolloutConfig = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        # HFGenerator options: seed = rollout.seed unless rollout.engine_kwargs.hf says otherwise, plus the replica's
        # rank: replicas with one seed draw the same numbers, so the samples of a GRPO group that verl spreads over
        # two replicas came out identical (seen with trainer.nnodes=2: zero advantages from step 2 on)
        self._generator_kwargs = {"seed": self.config.seed, **(self.config.engine_kwargs.get(ROLLOUT_NAME) or {})}
        if self._generator_kwargs["seed"] is not None:
            self._generator_kwargs["seed"] = int(self._generator_kwargs["seed"]) + replica_rank
        self._generator = HFGenerator.from_pretrained(
            self.model_config.local_path, dtype=dtype_name(self.config.dtype), **self._generator_kwargs
        )
        self._model = self._generator.model
        self._params = dict(self._model.named_parameters(remove_duplicate=False))
        self._max_model_len = int(self.config.max_model_len or self._generator.max_positions or 0) or None
        self._in_flight: set[str] = set()
        self._admitted = asyncio.Event()
        self._admitted.set()
        self._rejecting = False
        self._updated: set[int] | None = None  # ids of parameters written since begin_weight_update
        self._sync_kind = "weights"  # or "adapters": what the sync in progress carries
        self._lora = AdapterMerger()

    def _new_generator(self) -> HFGenerator:
        """A fresh generator over the same model (after an abort closed the previous one)."""
        from agentevolver.backends.cpu.generator import HFGenerator

        old = self._generator
        generator = HFGenerator(
            self._model, old.eos_token_ids, pad_token_id=old.pad_token_id, **self._generator_kwargs
        )
        generator.tokenizer = old.tokenizer
        return generator

    async def ready(self) -> dict[str, Any]:
        """Model facts; awaited by the replica at launch so a load failure surfaces there."""
        return {
            "path": self.model_config.local_path,
            "dtype": str(next(self._model.parameters()).dtype),
            "parameters": sum(p.numel() for p in self._model.parameters()),
            "eos_token_ids": list(self._generator.eos_token_ids),
        }

    # -- generation ---------------------------------------------------------------------------------------

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        """vLLM server's rule: requested or default budget, clamped to [1, context left]."""
        room = None if self._max_model_len is None else self._max_model_len - prompt_len
        if room is not None and room < 1:
            raise ValueError(
                f"prompt ({prompt_len} tokens) leaves no room to generate within the model's context "
                f"({self._max_model_len} tokens)"
            )
        requested = sampling_params.pop("max_tokens", None)
        if requested is None:
            requested = sampling_params.pop("max_new_tokens", None)
        if requested is None:
            requested = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            )
        requested = max(1, int(requested))
        return requested if room is None else min(requested, room)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Token-in/token-out generation, as verl's vLLM server's ``generate``."""
        from verl.workers.rollout.replica import TokenOutput

        if not self._admitted.is_set():  # between abort_all_requests and resume_generation
            if self._rejecting:
                return TokenOutput(
                    token_ids=[], stop_reason="aborted", extra_fields={"global_steps": self.global_steps}
                )
            await self._admitted.wait()
        params = dict(sampling_params)
        params["max_tokens"] = self._max_tokens(len(prompt_ids), params)
        if self.config.ignore_eos:
            params.setdefault("ignore_eos", True)
        kwargs.pop("priority", None)
        self._in_flight.add(request_id)
        try:
            output = await self._generator.generate(
                request_id, prompt_ids=prompt_ids, sampling_params=params,
                image_data=image_data, video_data=video_data, **kwargs,
            )
        finally:
            self._in_flight.discard(request_id)
        stop_reason = "completed" if output.stop_reason in ("completed", "length") else output.stop_reason
        return TokenOutput(
            token_ids=output.token_ids, log_probs=output.log_probs, stop_reason=stop_reason,
            extra_fields={"global_steps": self.global_steps},
        )

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Abort in-flight requests (they return ``stop_reason="aborted"``) and hold new ones.

        New requests wait for :meth:`resume_generation`, or return aborted at once with ``reject_request``.
        """
        self._rejecting = reject_request
        self._admitted.clear()
        request_ids = sorted(self._in_flight)
        old, self._generator = self._generator, self._new_generator()
        await old.aclose()
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def resume_generation(self) -> None:
        self._rejecting = False
        self._admitted.set()

    # -- weights --------------------------------------------------------------------------------------------

    async def begin_weight_update(self, kind: str = "weights") -> None:
        """Start a sync: from now on, every parameter written is recorded for :meth:`finish_weight_update`.

        ``kind``: ``"weights"`` (full tensors: full fine-tuning, LoRA merged by the trainer, or the base model of
        the LoRA adapters route) or ``"adapters"`` (LoRA adapters only, :meth:`load_lora_adapter`).
        """
        if kind not in ("weights", "adapters"):
            raise ValueError(f"begin_weight_update: kind must be 'weights' or 'adapters'; got {kind!r}")
        self._updated = set()
        self._sync_kind = kind
        self._lora.begin()

    async def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        """Copy ``(name, tensor)`` pairs into the model (names as in the HF model's state dict).

        A name with peft's ``.base_layer`` infix (verl's base sync for LoRA adapters) is a LoRA target's base
        weight: it loads under its HF name and becomes the base the target's adapters are merged onto.
        """
        from agentevolver.verl.cpu.lora import BASE_LAYER, base_name

        plain: list[tuple[str, torch.Tensor]] = []
        for name, tensor in weights:
            if BASE_LAYER + "." in name:
                name = base_name(name)
                self._lora.set_base(name, tensor)
            else:
                self._lora.forget([name])
            plain.append((name, tensor))
        count = await asyncio.to_thread(self._generator.load_weights, plain)
        if self._updated is not None:
            self._updated.update(id(self._params[name]) for name, _ in plain)
        return count

    async def load_lora_adapter(self, adapters: list[tuple[str, torch.Tensor]], peft_config: dict[str, Any]) -> int:
        """Merge LoRA adapters (peft names, both halves of a target in any order) into the served weights.

        Returns how many weights were written (a target whose other half is still to come is written later).
        """
        params = self._params

        def current(name: str) -> torch.Tensor:
            if name not in params:
                raise KeyError(f"LoRA adapter for {name!r}, which the rollout model does not have")
            return params[name]

        merged = self._lora.merge(adapters, peft_config, current)
        if not merged:
            return 0
        count = await asyncio.to_thread(self._generator.load_weights, merged)
        if self._updated is not None:
            self._updated.update(id(self._params[name]) for name, _ in merged)
        return count

    async def finish_weight_update(self, global_steps: int | None = None) -> int:
        """End a sync; returns how many parameters it wrote.

        A full sync must write every model parameter; an adapter sync must pair every half it received and
        cover every target of the first adapter sync (:meth:`AdapterMerger.finish`).
        """
        updated, self._updated = self._updated, None
        if updated is None:
            raise RuntimeError("finish_weight_update without begin_weight_update")
        if self._sync_kind == "adapters":
            self._lora.finish()
        else:
            missing = [name for name, param in self._model.named_parameters() if id(param) not in updated]
            if missing:
                raise RuntimeError(
                    f"weight sync left {len(missing)} parameter(s) of the rollout model unchanged "
                    f"(e.g. {missing[:5]}): the trainer sent different names"
                )
        if global_steps is not None:
            self.global_steps = global_steps
        return len(updated)

    async def set_global_steps(self, global_steps: int) -> None:
        """Step of the weights now loaded; returned in every output's ``extra_fields``."""
        self.global_steps = global_steps

    async def state_dict(self) -> dict[str, torch.Tensor]:
        """The served model's parameters (CPU copies), e.g. to compare them with a trainer checkpoint."""
        return {name: tensor.detach().clone() for name, tensor in self._model.state_dict().items()}

    # -- lifecycle: nothing to free on CPU ---------------------------------------------------------------------

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """No-op: the model stays in CPU memory, which the trainer does not need back."""

    async def sleep(self) -> None:
        """No-op, see :meth:`wake_up`."""

    async def clear_kv_cache(self) -> None:
        """No-op: the only keys/values kept between batches (the generator's shared-prefix cache) are
        dropped by every weight load, the one event that makes them stale."""

    async def release_kv_cache(self) -> None:
        """No-op: CPU memory is not handed back to the trainer during a weight sync."""

    async def resume_kv_cache(self) -> None:
        """No-op, see :meth:`release_kv_cache`."""

    async def start_profile(self, **kwargs: Any) -> None:
        """No-op: this backend has no profiler hook."""

    async def stop_profile(self) -> None:
        """No-op, see :meth:`start_profile`."""

    async def status(self) -> dict[str, Any]:
        """Step of the loaded weights (``global_steps``) and the generator's counters (``stats``)."""
        return {"global_steps": self.global_steps, "stats": dict(self._generator.stats)}
