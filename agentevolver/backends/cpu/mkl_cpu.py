"""Which of MKL's kernels torch's CPU library runs on an AMD CPU: its generic ones, or its Intel paths.

Why: torch links Intel's MKL into its CPU library, and MKL picks its kernels by the CPU's vendor before its
features. On an AMD CPU with AVX512-BF16 (Zen 4) it runs a bf16 x bf16 -> fp32 product (``GEMM_BF16BF16F32``)
as an fp32 ``sgemm`` (``MKL_VERBOSE=1`` and py-spy showed ``mkl_blas_def_sgemm_kernel_0_zen``), and torch's CPU
flash attention (SDPA, the update's attention) multiplies its bf16 blocks through exactly that call. MKL asks one
exported function, ``mkl_serv_intel_cpu_true``, whether the CPU is Intel's; a one-function library preloaded
into a process answers yes, and MKL then chooses among its Intel kernels by the features the CPU reports
(AVX512-BF16 here), as it does on an Intel CPU with the same features. The products are the same (bf16 products
are exact in fp32; only the summation order may differ). Measured on an AMD EPYC with AVX512-BF16
(``bench/update_profile.py``, docs/benchmarks.md): the quickstart's bare update 16.7 s -> 14.5 s, its attention
forward 1.52 s -> 0.86 s.

The run's choice is ``AGENTEVOLVER_MKL_CPU`` among the Ray workers' variables (:data:`MKL_CPU_KEY`,
config/backend/cpu.yaml): ``vendor`` (MKL decides, as torch ships), ``intel`` (always preload), or ``auto``
(preload where it was measured to help: an AMD CPU with AVX512-BF16, a bf16 compute dtype, and torch's MKL
asking that function). A preload is chosen when a process starts, so :func:`resolve_mkl_cpu` puts
``LD_PRELOAD`` into the workers' runtime env and into this process's environment before ``ray.init`` (the local
Ray's raylet and workers inherit it), as :mod:`agentevolver.backends.cpu.allocator` does.

The library is compiled once per machine with the system's C compiler (``cc``) into the cache; Python cannot
write a loadable library itself, and shipping a binary would tie it to one platform. No compiler: ``auto``
leaves MKL as it is (saying why), ``intel`` stops the run naming the key and the fix.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from agentevolver.errors import ConfigError

__all__ = ["CHOICES", "MKL_CPU_KEY", "MKL_CPU_VAR", "SYMBOL", "decide", "mkl_asks_vendor", "resolve_mkl_cpu",
           "shim_library"]

logger = logging.getLogger(__name__)

#: The variable that names the choice, and where the CPU preset sets it.
MKL_CPU_VAR = "AGENTEVOLVER_MKL_CPU"
MKL_CPU_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{MKL_CPU_VAR}"
CHOICES: tuple[str, ...] = ("auto", "vendor", "intel")

#: The function MKL asks whether the CPU is Intel's (exported by torch's CPU library when it links MKL).
SYMBOL = "mkl_serv_intel_cpu_true"
_SOURCE = f"/* AgentEvolver: MKL's vendor check answered yes (agentevolver/backends/cpu/mkl_cpu.py) */\nint {SYMBOL}(void) {{ return 1; }}\n"


def _torch_cpu_library() -> Path | None:
    """torch's CPU library, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / "lib" / "libtorch_cpu.so"
        if path.is_file():
            return path
    return None


def mkl_asks_vendor() -> bool:
    """Whether torch's CPU library exports MKL's vendor check, so a preloaded library can answer it (torch built
    with MKL on Linux). Loading the library is free where torch is imported already (the driver imports it)."""
    path = _torch_cpu_library()
    if path is None:
        return False
    try:
        return hasattr(ctypes.CDLL(str(path)), SYMBOL)
    except OSError:
        return False


def shim_library(compiler: str | None = None) -> Path | None:
    """The one-function library, compiled into the cache on first use; None without a C compiler."""
    from agentevolver.paths import cache_dir

    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:12]
    target = cache_dir() / "mkl_cpu" / f"libae_mkl_intel_cpu-{digest}.so"
    if target.is_file():
        return target
    compiler = compiler or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        source = Path(work) / "shim.c"
        source.write_text(_SOURCE)
        built = Path(work) / target.name
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(built), str(source)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not built.is_file():
            logger.warning("could not compile MKL's vendor-check library with %s: %s", compiler,
                           (done.stderr or done.stdout).strip()[-500:])
            return None
        os.replace(built, target)  # atomic: two processes compiling at once both end with a whole file
    return target


def decide(choice: str, *, vendor: str, flags: set[str] | frozenset[str], bf16: bool) -> tuple[bool, str]:
    """Whether ``choice`` preloads the library on this CPU, and why (for the log). ``vendor``: /proc/cpuinfo's
    ``vendor_id``; ``bf16``: whether the run computes in bf16. Raises :class:`ConfigError` for an unknown choice."""
    if choice not in CHOICES:
        raise ConfigError(f"{MKL_CPU_KEY}: must be one of {', '.join(CHOICES)}; got {choice!r}")
    if choice == "vendor":
        return False, "MKL picks its kernels by the CPU's vendor (as torch ships)"
    if choice == "intel":
        return True, "asked for (intel)"
    if vendor != "AuthenticAMD":
        return False, f"not an AMD CPU ({vendor or 'unknown vendor'}): MKL runs its Intel kernels already"
    if "avx512_bf16" not in flags:
        return False, "this AMD CPU has no avx512_bf16: MKL's bf16 kernels would not run here"
    if not bf16:
        return False, "the run computes in fp32, where MKL's generic kernels were not measured to lose"
    return True, "an AMD CPU with avx512_bf16 and a bf16 run: MKL's bf16 kernels instead of fp32 sgemm"


def _runs_bf16(cfg: DictConfig) -> bool:
    from agentevolver.backends.cpu.precision import AUTO_DTYPE_KEYS

    return any(str(OmegaConf.select(cfg, key, default="")).lower() in ("bf16", "bfloat16") for key in AUTO_DTYPE_KEYS)


def resolve_mkl_cpu(cfg: DictConfig) -> dict[str, str]:
    """Expand the config's choice (after the compute dtypes are resolved) into the variables that put it in
    force: ``LD_PRELOAD`` gains the library, in the workers' runtime env and in ``os.environ``. Returns the
    variables set; none where the config names no choice or the choice preloads nothing."""
    from agentevolver.backends.cpu.precision import cpu_field, machine_flags

    choice = OmegaConf.select(cfg, MKL_CPU_KEY, default=None)
    if choice is None:
        return {}
    wanted, why = decide(str(choice), vendor=cpu_field("vendor_id"), flags=machine_flags(), bf16=_runs_bf16(cfg))
    if not wanted:
        logger.debug("MKL's kernels left as they are: %s", why)
        return {}
    if not mkl_asks_vendor():
        if choice == "intel":
            raise ConfigError(f"{MKL_CPU_KEY}: intel needs torch's CPU library to export {SYMBOL} (torch built "
                              "with MKL, on Linux); this torch does not; set vendor")
        logger.info("MKL's kernels left as they are: this torch does not export %s", SYMBOL)
        return {}
    library = shim_library()
    if library is None:
        if choice == "intel":
            raise ConfigError(f"{MKL_CPU_KEY}: intel compiles a one-function library with the system's C compiler, "
                              "and none was found (apt-get install gcc), or set vendor")
        logger.info("MKL's kernels left as they are: no C compiler (cc) to build its vendor-check library")
        return {}
    runtime = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.LD_PRELOAD", default=None)
    present = str(runtime or os.environ.get("LD_PRELOAD") or "").split()
    env = {"LD_PRELOAD": " ".join([*[p for p in present if p != str(library)], str(library)])}
    with open_dict(cfg):
        OmegaConf.update(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.LD_PRELOAD", env["LD_PRELOAD"], merge=False)
    os.environ.update(env)
    logger.info("MKL runs its Intel kernels in the run's processes (%s; %s)", why, library)
    return env
