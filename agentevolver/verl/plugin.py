"""verl plugin of AgentEvolver: loaded by verl itself in every process that imports verl.

verl's ``__init__`` loads every ``verl.plugins`` entry point (``pyproject.toml`` names this module), so
Ray workers, the trainer's task runner and agent-loop workers all run this file once, during
``import verl`` and before any verl code asks for a platform, engine or rollout. verl swallows a failing
plugin at debug level, so every step here logs its own failure at WARNING and the others still run.

It registers:

* the ``cpu`` verl platform (:mod:`agentevolver.verl.cpu.platform`), chosen by ``VERL_PLATFORM=cpu``
  or by auto-detection when torch is a CPU-only build;
* on the ``cpu`` platform only: the process-group backend patch (:mod:`agentevolver.verl.patches`)
  and verl's FSDP engines for device ``cpu`` (:mod:`agentevolver.verl.cpu.engine`);
* the rollout ``hf`` (:mod:`agentevolver.verl.cpu.rollout`): its replica in verl's
  ``RolloutReplicaRegistry`` and its worker-side adapter in verl's rollout-class table (patch 3);
* AgentEvolver's agent loop ``agentevolver`` (:mod:`agentevolver.verl.agent_loop`) and, with it, the
  gateway's episode source ``program`` (:mod:`agentevolver.gateway.source`), which the loop looks up by name;
* Self-Navigating's policy loss ``exp_on_off`` in verl's policy-loss registry
  (:mod:`agentevolver.verl.step.exp_loss`; the trainer gives the actor the loss function that shows it the
  batch's ``exp_mask`` through verl's ``set_loss_fn``).

Importing verl's engine, rollout or agent-loop modules here, inside ``import verl``, would cost every
process seconds and risk circular imports. So all but the platform (which must exist before the first
``get_platform()``) and the patch (which must precede ``from verl.utils.distributed import ...``) are done
by :func:`when_imported` hooks: the registration runs right after the verl module it needs has been
imported, i.e. only in processes that use that module, and before the importing code can look it up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["register_all", "when_imported"]

logger = logging.getLogger(__name__)


class _AfterExecLoader(importlib.abc.Loader):
    """Delegates to the real loader and, once the module has executed, runs the finder's callbacks."""

    def __init__(self, loader: Any, finder: _PostImportFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._finder.done(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for inspect and tracebacks
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Wraps the loader of ``module_name`` so that callbacks run after it executes; leaves after that.

    It stays on ``sys.meta_path`` until the module has really been executed: a bare
    ``importlib.util.find_spec`` probe (no import) must not use the hook up.
    """

    def __init__(self, module_name: str) -> None:
        self.module_name = module_name
        self.callbacks: list[Callable[[ModuleType], None]] = []
        self._searching = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.module_name or self._searching:
            return None
        self._searching = True
        try:
            for finder in sys.meta_path:
                find_spec = getattr(finder, "find_spec", None)
                spec = find_spec(fullname, path, target) if finder is not self and find_spec is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._searching = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AfterExecLoader(spec.loader, self)
        return spec

    def done(self, module: ModuleType) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            _run(callback, module)


_PENDING: dict[str, _PostImportFinder] = {}


def _run(callback: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        callback(module)
    except Exception:
        logger.warning(
            "agentevolver verl plugin: %s after importing %s failed", getattr(callback, "__name__", callback),
            module.__name__, exc_info=True,
        )


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Run ``callback(module)`` as soon as ``module_name`` has been imported (now, if it already is).

    The callback runs inside the import statement that first loads the module, after the module's code
    and before the statement returns, so the importing code already sees its effect.
    """
    module = sys.modules.get(module_name)
    if module is not None:
        _run(callback, module)
        return
    finder = _PENDING.get(module_name)
    if finder is None or finder not in sys.meta_path:
        finder = _PostImportFinder(module_name)
        _PENDING[module_name] = finder
        sys.meta_path.insert(0, finder)
    finder.callbacks.append(callback)


# -- registrations -------------------------------------------------------------------------------------------


def _register_engines(module: ModuleType) -> None:
    from agentevolver.verl.cpu import engine

    engine.register()


def _load_hf_replica() -> type:
    from agentevolver.verl.cpu.rollout import HFReplica

    return HFReplica


def _register_hf_replica(module: ModuleType) -> None:
    module.RolloutReplicaRegistry.register("hf", _load_hf_replica)


def _register_hf_adapter(module: ModuleType) -> None:
    from agentevolver.verl import patches

    patches.apply_rollout(module)  # patch 3: verl has no registration call for worker-side rollout classes


def _register_agent_loop(module: ModuleType) -> None:
    import agentevolver.verl.agent_loop  # noqa: F401  (registers "agentevolver" on import)


def _register_episode_sources(module: ModuleType) -> None:
    import agentevolver.gateway.source  # noqa: F401  (registers "program", which agent_program runs look up)


def _register_exp_loss(module: ModuleType) -> None:
    from agentevolver.verl.step import exp_loss as loss

    loss.register()


def register_all() -> None:
    """Everything listed in the module docstring; safe to call more than once."""
    cpu = False
    try:
        from agentevolver.verl.cpu import platform

        platform.register()
        cpu = platform.selected()
    except Exception:
        logger.warning("agentevolver verl plugin: registering the cpu platform failed", exc_info=True)
    if cpu:
        try:
            from agentevolver.verl import patches

            patches.apply()
        except Exception:
            logger.warning(
                "agentevolver verl plugin: the cpu process-group patch was NOT applied; training workers "
                "will fail with 'Duplicate device type cpu'", exc_info=True,
            )
        when_imported("verl.workers.engine.fsdp.transformer_impl", _register_engines)
    when_imported("verl.workers.rollout.replica", _register_hf_replica)
    when_imported("verl.workers.rollout.base", _register_hf_adapter)
    when_imported("verl.experimental.agent_loop", _register_agent_loop)
    when_imported("verl.experimental.agent_loop", _register_episode_sources)
    when_imported("verl.trainer.ppo.core_algos", _register_exp_loss)


register_all()
