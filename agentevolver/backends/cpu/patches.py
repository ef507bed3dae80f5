"""The one monkeypatch verl 0.9.1 needs on CPU: the process-group backend string.

Patched function: ``verl.utils.distributed.initialize_global_process_group_ray(timeout_second=None,
backend=None)``. Without an explicit ``backend`` it builds ``f"cpu:gloo,{get_device_name()}:
{get_nccl_backend()}"``, meant as "gloo for CPU tensors, NCCL/HCCL for device tensors". On the ``cpu``
platform that string is ``"cpu:gloo,cpu:gloo"`` and ``torch.distributed.init_process_group`` rejects it
("Duplicate device type cpu in backend string"). Every training worker calls it without a backend
(``verl.workers.engine_workers``), so there is no configuration way around it.

The replacement passes ``backend="gloo"`` when the platform's device is ``cpu`` and the caller gave no
backend, and otherwise calls verl's function unchanged. It is installed by ``agentevolver.verl_plugin``
while ``import verl`` runs, i.e. before ``engine_workers`` and ``checkpoint_engine.base`` bind the name with
``from verl.utils.distributed import ...``; modules that already bound the original are rebound too.

:func:`apply` checks first that verl's function still looks as described (signature and the backend
string) and raises :class:`VerlChangedError` otherwise, so a verl upgrade that changes it fails loudly in
``tests/test_verl_cpu_backend.py`` instead of silently patching something else. Delete this module once verl
builds a valid backend string for ``cpu`` itself.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["TARGET", "VerlChangedError", "apply", "is_applied"]

#: The patched function, as ``module:attribute``.
TARGET = "verl.utils.distributed:initialize_global_process_group_ray"
_EXPECTED_PARAMETERS = ("timeout_second", "backend")
_EXPECTED_SOURCE = 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"'
_MARKER = "__agentevolver_cpu_patch__"


class VerlChangedError(RuntimeError):
    """verl's patched function no longer looks as this patch expects; re-check whether it is still needed."""


def _check(function: Callable[..., Any]) -> None:
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != _EXPECTED_PARAMETERS:
        raise VerlChangedError(
            f"{TARGET} now takes {parameters}; the CPU patch expects {_EXPECTED_PARAMETERS}. Re-check "
            "agentevolver/backends/cpu/patches.py against the installed verl."
        )
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError) as err:
        raise VerlChangedError(f"cannot read the source of {TARGET} to check it: {err}") from err
    if _EXPECTED_SOURCE not in source:
        raise VerlChangedError(
            f"{TARGET} no longer builds its default backend as {_EXPECTED_SOURCE}; verl may build a valid "
            "string for cpu now. Re-check whether agentevolver/backends/cpu/patches.py is still needed."
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
