"""verl platform ``cpu``: lets verl's trainer, workers and engines run on a machine without an accelerator.

verl resolves one platform per process (``verl.plugin.platform.get_platform``) and asks it for the device
name, the ``torch.<device>`` module, the collective backend and the Ray resource to reserve. It ships
nvidia/huawei/amd platforms only; on a CPU-only machine it falls back to ``nvidia`` and fails at the first
``cuda`` call. :class:`PlatformCPU` is registered as ``cpu`` by :func:`register` (called from
``agentevolver.verl.plugin`` in every process) and is selected when

* ``VERL_PLATFORM=cpu`` is set (verl's own override; the ``backend/cpu`` config preset sets it for every
  Ray worker), or
* auto-detection finds no accelerator platform and torch itself is a CPU-only build (no CUDA, no ROCm, no
  NPU): such a torch can never use a GPU, so ``cpu`` is the only correct answer there. A CUDA build of
  torch never auto-selects ``cpu``, even in a process that sees no GPU.

Choices, and why:

* ``current_device()`` returns the string ``"cpu"``, not an index: verl moves tensors with
  ``tensor.to(get_device_id())``, and ``.to(0)`` would mean ``cuda:0``.
* Collectives use ``gloo``.
* Ray resource ``GPU``: verl's resource pools reserve one ``GPU`` per worker and count ``GPU``/``NPU`` only
  when checking the cluster, so on CPU they are *logical* slots declared with ``ray.init(num_gpus=N)``
  (``ray_kwargs.ray_init.num_gpus`` in the preset): N slots = N training processes.
* :data:`device_module` is ``torch.cpu`` plus the memory/RNG/info calls verl makes on
  ``get_torch_device()`` that ``torch.cpu`` lacks (``empty_cache``, ``memory_allocated``,
  ``mem_get_info``, ``get_device_name``, ...): no-ops, zeros, or the host's RAM from psutil.
"""

from __future__ import annotations

import os
import platform as _host
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["PLATFORM_NAME", "PlatformCPU", "device_module", "register", "torch_is_cpu_only"]

#: The name to put in ``VERL_PLATFORM``.
PLATFORM_NAME = "cpu"


def torch_is_cpu_only() -> bool:
    """True when this torch build has no CUDA, ROCm or NPU support at all (e.g. the ``+cpu`` wheel)."""
    return torch.version.cuda is None and torch.version.hip is None and not hasattr(torch, "npu")


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host RAM."""
    try:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)
    except Exception:  # psutil missing or unreadable /proc: report "unknown" as zeros
        return 0, 0


def _device_name(device: Any = None) -> str:
    return f"CPU ({_host.processor() or _host.machine() or 'unknown'})"


def _device_properties(device: Any = None) -> SimpleNamespace:
    return SimpleNamespace(name=_device_name(), total_memory=_host_memory()[1], major=None, minor=None)


def _zero(device: Any = None) -> int:
    return 0


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _build_device_module() -> ModuleType:
    """``torch.cpu``'s public attributes plus the CUDA-module calls verl makes on ``get_torch_device()``."""
    module = ModuleType("agentevolver.verl.cpu.platform.device_module")
    module.__doc__ = "torch.cpu with no-op/zero stand-ins for the CUDA memory, RNG and info calls verl makes."
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    stand_ins = {
        # memory: CPU tensors live in ordinary process memory; there is no cache to free or account for
        "empty_cache": _noop,
        "ipc_collect": _noop,
        "set_per_process_memory_fraction": _noop,
        "reset_peak_memory_stats": _noop,
        "reset_accumulated_memory_stats": _noop,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "mem_get_info": lambda device=None: _host_memory(),
        # info
        "get_device_name": _device_name,
        "get_device_properties": _device_properties,
        "get_device_capability": lambda device=None: (None, None),
        # RNG: the CPU device's generator is torch's default generator
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "seed": torch.seed,
        "initial_seed": torch.initial_seed,
        "get_rng_state": lambda device=None: torch.get_rng_state(),
        "set_rng_state": lambda state, device=None: torch.set_rng_state(state),
    }
    for name, value in stand_ins.items():
        setattr(module, name, value)
    return module


#: What ``verl.utils.device.get_torch_device()`` returns under this platform.
device_module: ModuleType = _build_device_module()


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only machines; see the module docstring for each choice."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection only: accelerator platforms are probed first (registration order), and this one
        # claims the process only when torch cannot drive any accelerator.
        return torch_is_cpu_only()

    def current_device(self) -> str:  # type: ignore[override]  # "cpu", see the module docstring
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: Any) -> None:
        return None

    def synchronize(self, device_index: Any = None) -> None:
        return None  # CPU ops are synchronous

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # e.g. "expandable_segments:False": a CUDA caching-allocator option

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets this for the logical GPU slots; nothing on CPU reads it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"  # logical slots, see the module docstring

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def register() -> type[PlatformCPU]:
    """Register :class:`PlatformCPU` as verl platform ``cpu`` (idempotent).

    Must run before the first ``get_platform()`` call of the process, which caches its answer; the verl
    plugin entry point runs it while ``import verl`` executes, before any verl code asks.
    """
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)
    return PlatformCPU


def selected() -> bool:
    """Whether this process will run (or already runs) verl on the ``cpu`` platform.

    Answered without resolving verl's platform singleton: ``VERL_PLATFORM`` when set, else the same rule
    auto-detection applies (no accelerator platform claims the process and torch is CPU-only).
    """
    explicit = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if explicit:
        return explicit == PLATFORM_NAME
    return torch_is_cpu_only()
