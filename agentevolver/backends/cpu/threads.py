"""torch's thread count in the Ray workers of a CPU run (``OMP_NUM_THREADS: auto`` in config/backend/cpu.yaml).

Why: Ray sets ``OMP_NUM_THREADS=1`` in every worker whose actor or task names no ``num_cpus``, to keep many
small tasks from oversubscribing a node. None of verl's actors names one, so on CPU the actor update, the
reference pass and the rollout server each ran on one core however many the machine had. Those stages run
one after another, not side by side, so each may use every core. :func:`resolve_auto_threads` turns
``auto`` into the number of cores this process may run on (``os.sched_getaffinity``) on the driver, before
``ray.init`` reads the runtime env; a number given there is kept. On a cluster whose nodes differ, give a
number.

Async training (``trainer.mode=async``) runs the rollout server and the actor update side by side, so there
``auto`` gives each half the cores (at least one): with every core each, the two processes' threads fought
over the cores and both ran more than twice as slow as alone (the quickstart with slow tools, 2-core AMD
EPYC: rollout 24 -> 58 s, update 19 -> 44 s a step, 0.80x the synchronous loop's episodes per minute; with
one thread each, 1.24x; docs/benchmarks.md, "Async training against sync").
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig, OmegaConf, open_dict

from agentevolver.errors import ConfigError

__all__ = ["AUTO", "SPIN_COUNT", "THREADS_KEY", "WAIT_POLICY_KEY", "resolve_auto_threads", "resolve_wait_policy",
           "usable_cores"]

logger = logging.getLogger(__name__)

#: The value that asks for every usable core.
AUTO = "auto"

#: Where the CPU preset sets the workers' thread count.
THREADS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS"

#: Where the CPU preset sets how the workers' idle OpenMP threads wait.
WAIT_POLICY_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.OMP_WAIT_POLICY"

#: libgomp's spin (iterations) before an idle thread sleeps, while a process holds no more OpenMP threads than
#: cores; it drops to 1,000 beyond that unless the policy is ACTIVE.
SPIN_COUNT = "300000"


def usable_cores() -> int:
    """Cores this process may be scheduled on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_auto_threads(cfg: DictConfig, cores: int | None = None, side_by_side: int = 1) -> str | None:
    """Replace ``auto`` at :data:`THREADS_KEY` by the usable cores shared among ``side_by_side`` processes that
    compute at the same time (in place; at least 1 each); return the value, else None.

    Any value is made a string, since Ray refuses a runtime env whose variables are not strings.
    """
    value = OmegaConf.select(cfg, THREADS_KEY, default=None)
    if value is None:
        return None
    share = max(1, (cores or usable_cores()) // max(1, side_by_side))
    text = str(share) if str(value) == AUTO else str(value)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{THREADS_KEY}: must be auto or a whole number of threads >= 1; got {value!r}")
    with open_dict(cfg):
        OmegaConf.update(cfg, THREADS_KEY, text, merge=False)
    if str(value) == AUTO:
        logger.info("Ray workers' torch threads auto -> %s (the cores this process may use%s)", text,
                    f", shared by {side_by_side} processes computing side by side" if side_by_side > 1 else "")
    return text


def resolve_wait_policy(cfg: DictConfig, environ: dict[str, str] | None = None) -> str | None:
    """Resolve ``auto`` at :data:`WAIT_POLICY_KEY` (in place, before ray.init); return what the workers get.

    Why: GNU libgomp (torch's OpenMP) spins :data:`SPIN_COUNT` iterations between parallel regions while a
    process holds no more OpenMP threads than cores, and only 1,000 once it holds more, which happens as soon as
    two threads of one process have computed with torch (each keeps a team): the training worker hosting the
    rollout server (``trainer.rollout_server: worker``), whose update and decode run on different threads. Its idle
    threads then sleep between a decode step's hundreds of small regions, and decoding ran 30-40% slower
    (docs/benchmarks.md, "Fixed costs: the rollout server in the training worker"). ``auto`` = ``ACTIVE`` with
    ``GOMP_SPINCOUNT`` = :data:`SPIN_COUNT`: the spin a one-team process gets anyway, in every process.

    A policy in the driver's environment (``OMP_WAIT_POLICY=PASSIVE`` on a shared machine, as the test suite
    sets: docs/backends.md) wins: ``auto`` then leaves the variable out of the runtime env, so the workers
    inherit it. ``ACTIVE`` or ``PASSIVE`` (any case) is passed on; anything else is a :class:`ConfigError`.
    """
    value = OmegaConf.select(cfg, WAIT_POLICY_KEY, default=None)
    if value is None:
        return None
    environ = os.environ if environ is None else environ
    text = str(value)
    if text.upper() not in (AUTO.upper(), "ACTIVE", "PASSIVE"):
        raise ConfigError(f"{WAIT_POLICY_KEY}: must be auto, ACTIVE or PASSIVE; got {value!r}")
    env_vars = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars")
    with open_dict(cfg):
        if text != AUTO:
            env_vars.OMP_WAIT_POLICY = text.upper()
            return text.upper()
        if "OMP_WAIT_POLICY" in environ:
            del env_vars["OMP_WAIT_POLICY"]
            return environ["OMP_WAIT_POLICY"]
        env_vars.OMP_WAIT_POLICY = "ACTIVE"
        if "GOMP_SPINCOUNT" not in environ and "GOMP_SPINCOUNT" not in env_vars:
            env_vars.GOMP_SPINCOUNT = SPIN_COUNT
    return "ACTIVE"
