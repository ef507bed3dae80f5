"""Where the ``hf`` rollout server runs (``trainer.rollout_server``): in the training worker's process, or as a
Ray actor of its own.

verl's ``RolloutMode.HYBRID`` means a rollout engine fused into the training worker's process; its vLLM and
SGLang servers are still separate processes beside it. So was our ``hf`` server: a Ray actor that imports torch,
transformers and verl and loads the model again before it can serve (7.8-10.7 CPU seconds of a tiny-test run's
~40, docs/benchmarks.md "Fixed costs"), while the worker process, which has imported all of it, sits idle through
every rollout of the synchronous loop. ``worker`` builds the server inside that process instead
(:class:`~agentevolver.verl.cpu.hosting_worker.HFHostingWorker`): the same :class:`HFRolloutServer` object and
generator, called through the worker's actor (:class:`~agentevolver.verl.cpu.rollout_server.HostedServerHandle`),
and its weight sync becomes a copy inside one process instead of a transfer through Ray's object store.

``worker`` needs ``rollout.name=hf``, verl's hybrid engine, the synchronous loop (``trainer.mode=async`` updates
the actor while the next step's episodes generate; a Ray async actor runs the worker's synchronous methods, the
update among them, on the event loop that would serve the generation calls), one node and verl's legacy trainer;
where one is missing it stops the run before Ray starts, saying which. It is not the default, ``actor`` is: on a
CPU the worker's decode ran 20-40% slower than the actor's. The worker process holds two OpenMP teams (its
update's thread and the decode thread), and GNU libgomp spins 1k iterations instead of 300k between parallel
regions once a process holds more OpenMP threads than cores; the CPU preset's ``OMP_WAIT_POLICY: auto``
(agentevolver/backends/cpu/threads.py) keeps the long spin and recovers part of it, not all
(docs/benchmarks.md, "Fixed costs: the rollout server in the training worker"). What ``worker`` buys: ~10% less
CPU per small run and one process, with its ~1.3 GB of resident memory, less.
This module imports nothing heavy: the driver checks the key before Ray starts.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from agentevolver.errors import ConfigError

__all__ = ["CHOICES", "KEY", "hosts_rollout_server"]

#: The values of ``trainer.rollout_server``.
CHOICES = ("actor", "worker")
KEY = "trainer.rollout_server"


def _blockers(cfg: DictConfig) -> list[str]:
    """What keeps this run's rollout server out of the training worker's process (empty: nothing)."""
    found = []
    name = str(OmegaConf.select(cfg, "actor_rollout_ref.rollout.name", default=""))
    if name != "hf":
        found.append(f"actor_rollout_ref.rollout.name is {name!r} (only the hf server can live in the worker)")
    if not bool(OmegaConf.select(cfg, "actor_rollout_ref.hybrid_engine", default=True)):
        found.append("actor_rollout_ref.hybrid_engine is false (the rollout has workers of its own)")
    mode = str(OmegaConf.select(cfg, "trainer.mode", default="sync"))
    if mode != "sync":
        found.append(f"trainer.mode is {mode} (the update runs while episodes generate; in one process it would "
                     "hold the generation up)")
    nodes = int(OmegaConf.select(cfg, "trainer.nnodes", default=1) or 1)
    if nodes != 1:
        found.append(f"trainer.nnodes is {nodes}")
    if bool(OmegaConf.select(cfg, "trainer.use_v1", default=False)):
        found.append("trainer.use_v1 is true (verl's v1 trainer builds its workers its own way)")
    return found


def hosts_rollout_server(cfg: DictConfig) -> bool:
    """Whether this run builds its ``hf`` rollout server inside the training worker (``trainer.rollout_server``).
    ``worker`` where it cannot work is a :class:`ConfigError` that says why and what to set."""
    choice = str(OmegaConf.select(cfg, KEY, default="actor"))
    if choice not in CHOICES:
        raise ConfigError(f"{KEY}: must be one of {', '.join(CHOICES)}; got {choice!r}")
    if choice == "actor":
        return False
    blockers = _blockers(cfg)
    if blockers:
        raise ConfigError(f"{KEY}=worker cannot run here: {'; '.join(blockers)}. Set {KEY}=actor to run the "
                          "rollout server as a Ray actor of its own")
    return True
