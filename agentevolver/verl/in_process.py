"""verl's agent-loop workers in the trainer's own process (``trainer.agent_loop_workers``).

verl's ``AgentLoopManager`` runs episodes in ``rollout.agent.num_workers`` agent-loop workers, each a Ray actor:
a new Python process that imports torch, transformers and verl (7-8 CPU seconds, docs/benchmarks.md "Fixed
costs") to run code that is mostly waiting on the rollout server and the environment service. The process that
runs the training loop (the driver, or the TaskRunner actor) has imported all of it already and waits while
the episodes run. With one worker on one node (the CPU presets) that process can run the worker itself.

:class:`~agentevolver.verl.in_process_manager.InProcessAgentLoopManager` (set as verl's
``rollout.agent.agent_loop_manager_class`` by :func:`choose`) builds verl's own ``AgentLoopWorker`` objects here
(:class:`InProcessWorker`), each on a thread of its own with an event loop that lives as long as the
worker, as an async actor's does (the episodes' connection pools belong to that loop). The manager calls them
as it calls actors, ``worker.generate_sequences.remote(chunk)``, and awaits the result. Arguments cross by a
pickle round trip, as they would cross Ray, so the worker never shares an object with the manager.

``auto`` picks the trainer's process when it is safe and cheap: one agent-loop worker, one node, verl's legacy
trainer, and no agent-loop manager of the user's own. Anything else runs verl's actors, as before. ``actor``
keeps verl's way whatever the settings.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Generator
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from agentevolver.errors import ConfigError

__all__ = ["CHOICES", "MANAGER_CLASS", "InProcessWorker", "choose", "runs_in_process"]

#: The values of ``trainer.agent_loop_workers``.
CHOICES = ("auto", "in_process", "actor")
#: verl's ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for in-process workers.
MANAGER_CLASS = "agentevolver.verl.in_process_manager.InProcessAgentLoopManager"
_MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
_KEY = "trainer.agent_loop_workers"


def _blockers(cfg: DictConfig) -> list[str]:
    """What keeps this run's agent-loop workers out of the trainer's process (empty: nothing)."""
    found = []
    workers = int(OmegaConf.select(cfg, "actor_rollout_ref.rollout.agent.num_workers", default=8) or 8)
    if workers != 1:
        found.append(f"actor_rollout_ref.rollout.agent.num_workers is {workers} (in process: one worker, as "
                     "several would share one interpreter's lock)")
    nodes = int(OmegaConf.select(cfg, "trainer.nnodes", default=1) or 1)
    if nodes != 1:
        found.append(f"trainer.nnodes is {nodes} (verl spreads the workers over the nodes)")
    if bool(OmegaConf.select(cfg, "trainer.use_v1", default=False)):
        found.append("trainer.use_v1 is true (verl's v1 trainer has an agent-loop manager of its own)")
    manager = OmegaConf.select(cfg, _MANAGER_KEY, default=None)
    if manager not in (None, "", MANAGER_CLASS):
        found.append(f"{_MANAGER_KEY} names a manager of its own ({manager})")
    return found


def runs_in_process(cfg: DictConfig) -> bool:
    """Whether this run's agent-loop workers run in the trainer's process (``trainer.agent_loop_workers``).
    ``in_process`` where it cannot work is a :class:`ConfigError` that says why and what to set."""
    choice = str(OmegaConf.select(cfg, _KEY, default="auto"))
    if choice not in CHOICES:
        raise ConfigError(f"{_KEY}: must be one of {', '.join(CHOICES)}; got {choice!r}")
    if choice == "actor":
        return False
    blockers = _blockers(cfg)
    if choice == "in_process" and blockers:
        raise ConfigError(f"{_KEY}=in_process cannot run here: {'; '.join(blockers)}. Set {_KEY}=auto (or "
                          "actor) to run verl's agent-loop worker actors")
    return not blockers


def choose(cfg: DictConfig) -> bool:
    """Set verl's agent-loop manager to :class:`InProcessAgentLoopManager` where this run's workers run in the
    trainer's process (called before verl builds the manager); returns whether it did."""
    if not runs_in_process(cfg):
        return False
    with open_dict(cfg):
        OmegaConf.update(cfg, _MANAGER_KEY, MANAGER_CLASS, force_add=True)
    return True


def _copied(value: Any) -> Any:
    """``value`` after the pickle round trip Ray would give it on its way into an actor (Ray's cloudpickle, so
    whatever crosses to an actor crosses here, actor handles included)."""
    from ray import cloudpickle

    return cloudpickle.loads(cloudpickle.dumps(value))


class _Method:
    """``worker.name.remote(*args)``: schedules the call on the worker's loop; an awaitable of its result."""

    def __init__(self, worker: InProcessWorker, name: str) -> None:
        self._worker, self._name = worker, name

    def remote(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._worker.call(self._name, *_copied((args, kwargs)))


class _Pending:
    """A call running on a worker's loop: awaiting it waits for its result in the awaiting loop."""

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self._future = future

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.wrap_future(self._future).__await__()


class InProcessWorker:
    """One of verl's agent-loop workers (an instance of ``worker_class``) on a thread with its own event loop,
    called like an actor handle: ``await worker.generate_sequences.remote(batch)``."""

    def __init__(self, worker_class: type, name: str, *args: Any) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        # built on its loop's thread: whatever it binds to the running loop is bound to the one it will run on
        self._worker = self._submit(worker_class, *_copied(args)).result()

    def _submit(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``function`` (a coroutine function, or a plain one) on the worker's loop; a concurrent future."""
        async def call() -> Any:
            result = function(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(call(), self._loop)

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Awaitable[Any]:
        """``name(*args, **kwargs)`` on the worker, started now and awaitable from any loop (as an object ref
        is awaitable wherever it is awaited)."""
        return _Pending(self._submit(getattr(self._worker, name), *args, **kwargs))

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)

    def stop(self) -> None:
        """Stop the worker's loop and thread (its pending episodes are cancelled with the loop)."""
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
