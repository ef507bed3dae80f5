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

``auto`` picks ``worker`` where nothing else computes in that process while episodes run: ``rollout.name=hf``,
verl's hybrid engine, the synchronous loop (``trainer.mode=async`` updates the actor while the next step's
episodes generate; a Ray async actor runs the worker's synchronous methods, the update among them, on the event
loop that would serve the generation calls), one node, and verl's legacy trainer. Anything else keeps the actor.
``actor`` keeps the actor whatever the settings (e.g. to look the server up by its actor name, ``hf_server_0_0``).
This module imports nothing heavy: the driver checks the key before Ray starts.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from agentevolver.errors import ConfigError

__all__ = ["CHOICES", "KEY", "hosts_rollout_server"]

#: The values of ``trainer.rollout_server``.
CHOICES = ("auto", "worker", "actor")
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
    choice = str(OmegaConf.select(cfg, KEY, default="auto"))
    if choice not in CHOICES:
        raise ConfigError(f"{KEY}: must be one of {', '.join(CHOICES)}; got {choice!r}")
    if choice == "actor":
        return False
    blockers = _blockers(cfg)
    if choice == "worker" and blockers:
        raise ConfigError(f"{KEY}=worker cannot run here: {'; '.join(blockers)}. Set {KEY}=auto (or actor) to "
                          "run the rollout server as a Ray actor of its own")
    return not blockers
