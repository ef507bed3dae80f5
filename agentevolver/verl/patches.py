"""Every monkeypatch this project applies to verl 0.9.1, each behind a guard that fails if verl changed.

verl's registries and entry points cover almost everything (platform, engines, rollout, agent loop, policy
loss, advantage estimator); these three places have no seam:

1. **Process-group backend on CPU** (:func:`apply`, installed by :mod:`agentevolver.verl_plugin` on the ``cpu``
   platform). Patched: ``verl.utils.distributed.initialize_global_process_group_ray(timeout_second=None,
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

2. **Logger backends** (:func:`apply_tracking`, installed by the trainer's task runner before ``fit()``).
   ``RayPPOTrainer.fit`` builds ``verl.utils.tracking.Tracking`` itself (``from verl.utils.tracking import
   Tracking`` inside the method) from ``trainer.logger``, and ``Tracking`` only knows a fixed list of
   backends, so a project cannot add one. The replacement is a subclass
   (:class:`agentevolver.module.trainer.tracking.RunTracking`) that adds this project's ``table`` (the
   per-step console table) and ``jsonl`` (``<run dir>/metrics.jsonl``) backends and passes every other
   name to verl unchanged.

3. **Extra inputs of the policy loss** (:func:`apply_exp_loss`, installed by :mod:`agentevolver.verl_plugin`
   right after ``verl.workers.engine_workers`` is imported, on every platform). Patched: the name
   ``verl.workers.engine_workers.ppo_loss``. verl's ``ppo_loss`` (``verl.workers.utils.losses``) passes a
   registered policy loss only fixed fields of the batch (old log-probs, advantages, response mask,
   rollout-IS weights), so Self-Navigating's off-policy loss ``exp_on_off`` cannot see the batch's
   ``exp_mask`` nor the ``exp_off_cliprange_high`` of its ``meta_info``. The actor worker builds its loss as
   ``partial(ppo_loss, config=actor_config)`` from the name it imported, so rebinding that name (before the
   worker's ``init_model``) makes it use :func:`agentevolver.module.exp_manager.loss.exp_aware_ppo_loss`,
   which publishes both in a context variable for the call and then runs verl's ``ppo_loss`` unchanged (a
   batch without ``exp_mask`` gets exactly verl's loss). verl's distillation loss (``distillation_ppo_loss``)
   is not covered. Delete it once verl forwards extra batch fields to the policy loss.

Each ``apply*`` checks first that verl's code still looks as described (signature and the source it relies
on) and raises :class:`VerlChangedError` otherwise, so a verl upgrade that changes it fails loudly in
``tests/test_verl_cpu_backend.py`` / ``tests/test_trainer_stages.py`` / ``tests/test_exp_loss.py`` instead
of silently patching something else.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["EXP_LOSS_TARGET", "TARGET", "TRACKING_TARGET", "VerlChangedError", "apply", "apply_exp_loss",
           "apply_tracking", "exp_loss_is_applied", "is_applied", "tracking_is_applied"]

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
            "agentevolver/verl_patches.py against the installed verl."
        )
    if _EXPECTED_SOURCE not in _source(function, TARGET):
        raise VerlChangedError(
            f"{TARGET} no longer builds its default backend as {_EXPECTED_SOURCE}; verl may build a valid "
            "string for cpu now. Re-check whether agentevolver/verl_patches.py (patch 1) is still needed."
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


# --- 2. logger backends ----------------------------------------------------------------------------------

#: The replaced class, as ``module:attribute``.
TRACKING_TARGET = "verl.utils.tracking:Tracking"
_TRACKING_PARAMETERS = ("self", "project_name", "experiment_name", "default_backend", "config")
#: What ``RayPPOTrainer.fit`` must still contain for the replacement to be the class it builds.
_FIT_SOURCE = ("from verl.utils.tracking import Tracking", "default_backend=self.config.trainer.logger")


def _check_tracking(tracking_cls: type, fit: Callable[..., Any]) -> None:
    parameters = tuple(inspect.signature(tracking_cls.__init__).parameters)
    if parameters != _TRACKING_PARAMETERS:
        raise VerlChangedError(
            f"{TRACKING_TARGET}.__init__ now takes {parameters}; the logger patch expects "
            f"{_TRACKING_PARAMETERS}. Re-check agentevolver/verl_patches.py (patch 2) against the installed verl."
        )
    source = _source(fit, "RayPPOTrainer.fit")
    missing = [line for line in _FIT_SOURCE if line not in source]
    if missing:
        raise VerlChangedError(
            f"RayPPOTrainer.fit no longer contains {missing}: it may not build {TRACKING_TARGET} from "
            "trainer.logger any more. Re-check agentevolver/verl_patches.py (patch 2)."
        )


def tracking_is_applied() -> bool:
    """Whether :func:`apply_tracking` has replaced verl's ``Tracking`` in this process."""
    import verl.utils.tracking as tracking

    return getattr(tracking.Tracking, _MARKER, False)


def apply_tracking() -> bool:
    """Make ``trainer.logger`` accept this project's backends (idempotent); True when installed by this call.

    Raises:
        VerlChangedError: verl's ``Tracking`` or ``RayPPOTrainer.fit`` differs from what this patch expects.
    """
    import verl.utils.tracking as tracking
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from agentevolver.module.trainer.tracking import RunTracking

    if getattr(tracking.Tracking, _MARKER, False):
        return False
    _check_tracking(tracking.Tracking, RayPPOTrainer.fit)
    setattr(RunTracking, _MARKER, True)
    tracking.Tracking = RunTracking
    return True


# --- 3. extra inputs of the policy loss ---------------------------------------------------------------

#: The rebound name, as ``module:attribute``.
EXP_LOSS_TARGET = "verl.workers.engine_workers:ppo_loss"
_PPO_LOSS_PARAMETERS = ("config", "model_output", "data", "dp_group")
#: What ``engine_workers`` must still contain for the rebound name to be the actor's loss function.
_ENGINE_WORKERS_SOURCE = "partial(ppo_loss, config=actor_config)"


def _check_exp_loss(engine_workers: ModuleType) -> None:
    ppo_loss = getattr(engine_workers, "ppo_loss", None)
    if ppo_loss is None:
        raise VerlChangedError(
            f"{EXP_LOSS_TARGET} does not exist any more; re-check agentevolver/verl_patches.py (patch 3)."
        )
    parameters = tuple(inspect.signature(ppo_loss).parameters)
    if parameters != _PPO_LOSS_PARAMETERS:
        raise VerlChangedError(
            f"{EXP_LOSS_TARGET} now takes {parameters}; the exp-loss patch expects {_PPO_LOSS_PARAMETERS}. "
            "Re-check agentevolver/verl_patches.py (patch 3) against the installed verl."
        )
    if _ENGINE_WORKERS_SOURCE not in _source(engine_workers, engine_workers.__name__):
        raise VerlChangedError(
            f"{engine_workers.__name__} no longer contains {_ENGINE_WORKERS_SOURCE!r}: the actor may not "
            "build its loss from the name ppo_loss any more. Re-check agentevolver/verl_patches.py (patch 3)."
        )


def exp_loss_is_applied() -> bool:
    """Whether :func:`apply_exp_loss` has rebound ``engine_workers.ppo_loss`` in this process."""
    import verl.workers.engine_workers as engine_workers

    from agentevolver.module.exp_manager.loss import exp_aware_ppo_loss

    return engine_workers.ppo_loss is exp_aware_ppo_loss


def apply_exp_loss() -> bool:
    """Make verl's actor worker use the exp-aware ``ppo_loss`` (idempotent); True when installed by this call.

    Raises:
        VerlChangedError: ``engine_workers`` or ``ppo_loss`` differs from what this patch expects.
    """
    import verl.workers.engine_workers as engine_workers

    from agentevolver.module.exp_manager.loss import exp_aware_ppo_loss

    if exp_loss_is_applied():
        return False
    _check_exp_loss(engine_workers)
    engine_workers.ppo_loss = exp_aware_ppo_loss
    return True
