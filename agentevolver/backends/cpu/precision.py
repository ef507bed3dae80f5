"""The CPU backend's compute dtype: bf16 where it is faster on this CPU, else fp32 (``auto`` in the config).

Why: on a CPU with AVX512-BF16 or AMX-BF16, oneDNN runs bf16 matrix products faster than fp32 on most
machines (4x on an AMD EPYC with AVX512-BF16, bench/precision.py); on one without them bf16 is emulated and
slower. The flag alone is not enough: on an Intel Xeon VM that lists ``avx512_bf16`` but no AMX, bf16 matrix
products ran at 0.58x fp32's rate and every stage of a step was slower (docs/benchmarks.md). So ``auto``
asks two things: does the CPU list a bf16 flag (:func:`cpu_bf16_support`, /proc/cpuinfo read once per
process), and is a bf16 matrix product at least :data:`MIN_BF16_SPEEDUP` times faster than fp32 here
(:func:`bf16_speedup`, a ~0.3 s probe measured once per machine and kept in the cache folder, so every
process of a run decides alike)?

config/backend/cpu.yaml sets the actor's and reference's FSDP ``mixed_precision.param_dtype`` and the
rollout's ``dtype`` to ``auto``, and :func:`resolve_auto_dtypes` turns each ``auto`` into ``bf16`` or
``fp32`` on the driver before verl reads them; ``agentevolver.main_ppo`` prints the choice with the flag and
the measured speed-up, the resolved config keeps it and the launcher's ``launch.json`` records it.

Only the compute dtype changes: verl loads a trained model in fp32 (``model_dtype``), FSDP2's
mixed-precision policy casts the parameters to bf16 for forward and backward and keeps fp32 master weights,
optimiser state and gradient reductions (``reduce_dtype: fp32``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = [
    "AUTO", "AUTO_DTYPE_KEYS", "BF16_FLAGS", "MIN_BF16_SPEEDUP", "bf16_speedup", "cpu_bf16_support", "cpu_field",
    "describe", "machine_flags", "machine_summary", "resolve_auto_dtypes", "resolve_dtype",
]

logger = logging.getLogger(__name__)

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

#: ``auto`` picks bf16 only when the probe's bf16 matrix product is at least this much faster than fp32's (a
#: margin over the probe's noise; the step's other work gains less than its matrix products).
MIN_BF16_SPEEDUP = 1.1

#: The probe: (tokens x width) @ (width x width), the shape of a small model's projections over a batch.
_PROBE_SHAPE = (512, 1024, 1024)
_PROBE_REPEATS = 6
_PROBE_ROUNDS = 3

_CPUINFO = Path("/proc/cpuinfo")


def _field_of(cpuinfo: str, name: str) -> str:
    for line in cpuinfo.splitlines():
        if line.startswith(name):
            return line.partition(":")[2].strip()
    return ""


def _flags_of(cpuinfo: str) -> set[str]:
    return set(_field_of(cpuinfo, "flags").split())


@functools.cache
def _cpuinfo() -> str:
    try:
        return _CPUINFO.read_text()
    except OSError:  # not Linux: no flags known, so no bf16 assumed
        return ""


@functools.cache
def _machine_flags() -> frozenset[str]:
    return frozenset(_flags_of(_cpuinfo()))


def cpu_field(name: str) -> str:
    """One field of this machine's /proc/cpuinfo (its first CPU), e.g. ``vendor_id``; "" where there is none."""
    return _field_of(_cpuinfo(), name)


def machine_flags() -> frozenset[str]:
    """This machine's CPU flags (/proc/cpuinfo, read once per process); empty where there is none."""
    return _machine_flags()


def cpu_bf16_support(flags: Iterable[str] | None = None) -> str | None:
    """The flag that gives this CPU native bf16 (``amx_bf16`` or ``avx512_bf16``), or None.

    ``flags`` replaces the machine's own (tests simulate CPUs with it); by default /proc/cpuinfo is read
    once per process.
    """
    present = _machine_flags() if flags is None else set(flags)
    return next((flag for flag in BF16_FLAGS if flag in present), None)


def machine_summary() -> dict[str, Any]:
    """This machine in three facts: the CPU model, the cores this process may use, the native bf16 flag.

    Why: the same weights validated greedily in bf16 score differently on different CPUs (AMX and AVX-512
    kernels round differently: the hard ablation's untrained model solved 44 of 102 tasks on two machines and
    43 on a third), so an ablation records the machine of every attempt and its report shows it beside each
    run. Reads no more than /proc/cpuinfo (once per process) and starts no probe.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 0
    return {"cpu": _field_of(_cpuinfo(), "model name") or "unknown", "cores": cores, "bf16": cpu_bf16_support()}


def _measure_speedup() -> float:
    """fp32 seconds / bf16 seconds of the probe's matrix product in this process (best of a few rounds,
    the dtypes alternating so that a change of load falls on both)."""
    import torch

    rows, width, cols = _PROBE_SHAPE
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    operands = {dtype: (torch.randn(rows, width, dtype=dtype), torch.randn(width, cols, dtype=dtype)) for dtype in best}
    for a, b in operands.values():  # warm-up: oneDNN builds its kernels on first use
        a @ b
    for _ in range(_PROBE_ROUNDS):
        for dtype, (a, b) in operands.items():
            begin = time.perf_counter()
            for _ in range(_PROBE_REPEATS):
                a @ b
            best[dtype] = min(best[dtype], time.perf_counter() - begin)
    return best[torch.float32] / best[torch.bfloat16]


def _probe_key() -> str:
    """What the probe's result depends on: the CPU model and flags, torch's version and its thread count."""
    import torch

    flags = hashlib.sha256(" ".join(sorted(_machine_flags())).encode()).hexdigest()[:12]
    return f"{_field_of(_cpuinfo(), 'model name')}|flags {flags}|torch {torch.__version__}|{torch.get_num_threads()} threads"


@functools.cache
def bf16_speedup() -> float:
    """How much faster a bf16 matrix product is than fp32 on this machine (fp32 s / bf16 s; < 1: slower).

    Measured once per machine and kept in ``<cache>/cpu_bf16_probe.json`` under the CPU model, flags, torch
    version and thread count, so that every process of a run (and every later run) decides alike; delete the
    file to measure again.
    """
    from agentevolver.paths import cache_dir

    path = cache_dir() / "cpu_bf16_probe.json"
    key = _probe_key()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):  # not ours: measured again and replaced
        known = {}
    entry = known.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("speedup"), int | float):
        return float(entry["speedup"])
    speedup = round(_measure_speedup(), 3)
    known[key] = {"speedup": speedup, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        scratch.write_text(json.dumps(known, indent=1))
        scratch.replace(path)
    except OSError as err:  # a read-only cache costs a probe per process, nothing else
        logger.warning("cannot keep the bf16 probe's result in %s: %s", path, err)
    logger.info("bf16 probe: bf16 matrix products run %.2fx fp32's speed on this CPU (%s)", speedup, key)
    return speedup


def resolve_dtype(value: Any, *, flags: Iterable[str] | None = None, speedup: float | None = None) -> str:
    """``value`` itself, or for ``auto`` ``bf16`` when the CPU lists a bf16 flag and bf16 matrix products are at
    least :data:`MIN_BF16_SPEEDUP` times faster here (``speedup``, measured when not given), else ``fp32``.

    ``flags`` and ``speedup`` replace the machine's own (tests simulate CPUs with them).
    """
    text = str(value)
    if text != AUTO:
        return text
    if not cpu_bf16_support(flags):
        return "fp32"
    return "bf16" if (bf16_speedup() if speedup is None else speedup) >= MIN_BF16_SPEEDUP else "fp32"


def resolve_auto_dtypes(cfg: DictConfig, *, flags: Iterable[str] | None = None,
                        speedup: float | None = None) -> dict[str, str]:
    """Replace every ``auto`` among :data:`AUTO_DTYPE_KEYS` in ``cfg`` (in place); return ``{key: dtype}``.

    Keys that are absent or not ``auto`` are left as they are and not returned; the caller announces the
    choice (``agentevolver.main_ppo`` prints it with the CPU flag it rests on).
    """
    chosen: dict[str, str] = {}
    for key in AUTO_DTYPE_KEYS:
        if OmegaConf.select(cfg, key, default=None) != AUTO:
            continue
        chosen[key] = resolve_dtype(AUTO, flags=flags, speedup=speedup)
        with open_dict(cfg):
            OmegaConf.update(cfg, key, chosen[key], merge=False)
    return chosen


def describe(cfg: DictConfig) -> dict[str, Any] | None:
    """What ``auto`` resolves to for ``cfg`` on this machine, for the run record (None off the CPU backend)."""
    if str(OmegaConf.select(cfg, "trainer.device", default="")) != "cpu":
        return None
    dtypes = {key: resolve_dtype(OmegaConf.select(cfg, key, default=AUTO)) for key in AUTO_DTYPE_KEYS}
    flag = cpu_bf16_support()
    return {"cpu_bf16_flag": flag, "bf16_speedup": bf16_speedup() if flag else None, "dtypes": dtypes}
