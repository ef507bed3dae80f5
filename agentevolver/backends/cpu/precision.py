"""The CPU backend's compute dtype: bf16 where the CPU has bf16 units, else fp32 (``auto`` in the config).

Why: on a CPU with AVX512-BF16 or AMX-BF16, oneDNN runs bf16 matrix products several times faster than
fp32 (bench/precision.py measures each stage); on one without them bf16 is emulated and slower than fp32.
So config/backend/cpu.yaml sets the actor's and reference's FSDP ``mixed_precision.param_dtype`` and the
rollout's ``dtype`` to ``auto``, and :func:`resolve_auto_dtypes` turns each ``auto`` into ``bf16`` or
``fp32`` on the driver before verl reads them. The CPU's flags are read once per process
(:func:`cpu_bf16_support`); ``agentevolver.main_ppo`` prints the choice, the resolved config keeps it and
the launcher's ``launch.json`` records it.

Only the compute dtype changes: verl loads a trained model in fp32 (``model_dtype``), FSDP2's
mixed-precision policy casts the parameters to bf16 for forward and backward and keeps fp32 master weights,
optimiser state and gradient reductions (``reduce_dtype: fp32``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = [
    "AUTO", "AUTO_DTYPE_KEYS", "BF16_FLAGS", "cpu_bf16_support", "describe", "resolve_auto_dtypes", "resolve_dtype",
]

#: The value that asks for the CPU's best dtype.
AUTO = "auto"

#: /proc/cpuinfo flags that mean native bf16 matrix products, best first (AMX tiles, then AVX-512 bf16 dot
#: products). Without one of them, bf16 runs through fp32 conversions and is slower than fp32.
BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")

#: The config keys whose value may be ``auto`` (dotted paths of the composed config).
AUTO_DTYPE_KEYS: tuple[str, ...] = (
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype",
    "actor_rollout_ref.rollout.dtype",
)

_CPUINFO = Path("/proc/cpuinfo")


def _flags_of(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


@functools.cache
def _machine_flags() -> frozenset[str]:
    try:
        return frozenset(_flags_of(_CPUINFO.read_text()))
    except OSError:  # not Linux: no flags known, so no bf16 assumed
        return frozenset()


def cpu_bf16_support(flags: Iterable[str] | None = None) -> str | None:
    """The flag that gives this CPU native bf16 (``amx_bf16`` or ``avx512_bf16``), or None.

    ``flags`` replaces the machine's own (tests simulate CPUs with it); by default /proc/cpuinfo is read
    once per process.
    """
    present = _machine_flags() if flags is None else set(flags)
    return next((flag for flag in BF16_FLAGS if flag in present), None)


def resolve_dtype(value: Any, *, flags: Iterable[str] | None = None) -> str:
    """``value`` itself, or for ``auto`` ``bf16`` when the CPU has native bf16 and ``fp32`` otherwise."""
    text = str(value)
    if text != AUTO:
        return text
    return "bf16" if cpu_bf16_support(flags) else "fp32"


def resolve_auto_dtypes(cfg: DictConfig, *, flags: Iterable[str] | None = None) -> dict[str, str]:
    """Replace every ``auto`` among :data:`AUTO_DTYPE_KEYS` in ``cfg`` (in place); return ``{key: dtype}``.

    Keys that are absent or not ``auto`` are left as they are and not returned; the caller announces the
    choice (``agentevolver.main_ppo`` prints it with the CPU flag it rests on).
    """
    chosen: dict[str, str] = {}
    for key in AUTO_DTYPE_KEYS:
        if OmegaConf.select(cfg, key, default=None) != AUTO:
            continue
        chosen[key] = resolve_dtype(AUTO, flags=flags)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, chosen[key], merge=False)
    return chosen


def describe(cfg: DictConfig) -> dict[str, Any] | None:
    """What ``auto`` resolves to for ``cfg`` on this machine, for the run record (None off the CPU backend)."""
    if str(OmegaConf.select(cfg, "trainer.device", default="")) != "cpu":
        return None
    dtypes = {key: resolve_dtype(OmegaConf.select(cfg, key, default=AUTO)) for key in AUTO_DTYPE_KEYS}
    return {"cpu_bf16_flag": cpu_bf16_support(), "dtypes": dtypes}
