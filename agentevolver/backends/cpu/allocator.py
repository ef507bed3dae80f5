"""Memory-allocator settings for CPU processes (glibc tunables, or a preloaded allocator library).

glibc's malloc serves blocks above its mmap threshold with ``mmap`` and returns them with ``munmap``; a
PyTorch step frees and allocates the same large buffers again and again, so on CPU the kernel maps and
zero-fills them on every step. :data:`GLIBC_TUNED` keeps freed memory in the heap for reuse. An allocator is
chosen when a process starts, so these are environment variables given to processes before they start
(bench/allocator.py measures them).

The run's choice is ``AGENTEVOLVER_ALLOCATOR`` among the Ray workers' variables (:data:`ALLOCATOR_KEY`,
config/backend/cpu.yaml). :func:`resolve_allocator` expands it into the variables that select it, for the
workers (the runtime env, which Ray applies before a worker's process starts) and for this process's
children (``os.environ``: the local Ray's raylet and workers inherit it); the launcher gives the same
variables to the services and the training process it starts (:func:`allocator_env`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from agentevolver.errors import ConfigError

__all__ = ["ALLOCATORS", "ALLOCATOR_KEY", "ALLOCATOR_VAR", "GLIBC_TUNED", "allocator_env", "configured_env",
           "preload_library", "resolve_allocator"]

logger = logging.getLogger(__name__)

#: glibc tunables (legacy ``MALLOC_*_`` variables, read at process start): no mmap for big blocks (threshold
#: 1 TB), never trim the heap top (100 GB), grow the heap 1 GB at a time (virtual: only touched pages count).
GLIBC_TUNED: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": "1000000000000",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
    "MALLOC_TOP_PAD_": "1000000000",
}

#: The allocators ``LD_PRELOAD`` can load: Debian's file name of each, and the package that installs it.
_LIBRARIES = {"jemalloc": ("libjemalloc.so.2", "libjemalloc2"), "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4")}
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")

#: The choices: glibc as it comes, glibc with :data:`GLIBC_TUNED`, or a preloaded library.
ALLOCATORS: tuple[str, ...] = ("default", "glibc-tuned", *_LIBRARIES)

#: The variable that names the run's allocator, and where the CPU preset sets it.
ALLOCATOR_VAR = "AGENTEVOLVER_ALLOCATOR"
ALLOCATOR_KEY = f"ray_kwargs.ray_init.runtime_env.env_vars.{ALLOCATOR_VAR}"


def preload_library(name: str) -> str | None:
    """The path of allocator ``name`` (``jemalloc`` or ``tcmalloc``) when installed, else None."""
    file = _LIBRARIES[name][0]
    for folder in _LIBRARY_DIRS:
        path = Path(folder) / file
        if path.is_file():
            return str(path)
    return None


def allocator_env(name: str, *, key: str = ALLOCATOR_KEY, preload: str | None = None) -> dict[str, str]:
    """The environment variables that give a new process allocator ``name`` (the name itself included, so a
    process can tell which it was given). ``preload``: an ``LD_PRELOAD`` already in force, kept after ours.

    Raises :class:`ConfigError` naming ``key`` for an unknown name or a library that is not installed.
    """
    if name not in ALLOCATORS:
        raise ConfigError(f"{key}: must be one of {', '.join(ALLOCATORS)}; got {name!r}")
    env = {ALLOCATOR_VAR: name}
    if name == "glibc-tuned":
        env.update(GLIBC_TUNED)
    elif name in _LIBRARIES:
        library = preload_library(name)
        if library is None:
            file, package = _LIBRARIES[name]
            raise ConfigError(f"{key}: {name} needs {file}, which is not installed "
                              f"(apt-get install {package}), or choose default or glibc-tuned")
        others = [part for part in (preload or "").split() if part != library]
        env["LD_PRELOAD"] = " ".join([library, *others])
    return env


def configured_env(cfg: DictConfig) -> dict[str, str]:
    """The variables that select the allocator the config names at :data:`ALLOCATOR_KEY` for processes started
    from this one (an ``LD_PRELOAD`` in force here is kept); none where the config names no allocator, only the
    name for ``default``."""
    name = OmegaConf.select(cfg, ALLOCATOR_KEY, default=None)
    return {} if name is None else allocator_env(str(name), preload=os.environ.get("LD_PRELOAD"))


def resolve_allocator(cfg: DictConfig) -> dict[str, str]:
    """Expand the config's allocator into the variables that select it (in place, among the Ray workers'
    variables), and put them into ``os.environ`` so that processes started from here (the local Ray's raylet
    and workers) start with it. Returns the variables (:func:`configured_env`)."""
    env = configured_env(cfg)
    if not env:
        return env
    name = env[ALLOCATOR_VAR]
    with open_dict(cfg):
        for var, value in env.items():
            OmegaConf.update(cfg, f"ray_kwargs.ray_init.runtime_env.env_vars.{var}", value, merge=False)
    os.environ.update(env)
    if name != "default":
        logger.info("memory allocator of the run's processes: %s (%s)", name,
                    " ".join(f"{k}={v}" for k, v in env.items() if k != ALLOCATOR_VAR))
    return env
