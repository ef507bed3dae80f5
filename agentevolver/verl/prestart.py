"""Start the rollout server and the agent-loop workers beside the training worker (``trainer.prestart``).

verl's ``init_workers`` starts a run's processes one after another: the FSDP worker group, then, once its model
is loaded, the rollout server (:class:`~agentevolver.verl.cpu.rollout.HFRolloutServer`), then the agent-loop
workers. Each is a new process that imports torch, transformers and verl before it can do anything (5-9 s on
2 cores), and each waits for the one before it, while the cores sit half idle. On one node nothing the two later
processes need *to start* comes from the FSDP worker:

* the ``hf`` rollout server is built from the config alone (it loads the model from disk; the training worker
  pushes its weights before the first rollout), so it can start with the worker group;
* an agent-loop worker needs the server client and the reward workers only to work, so its process can start
  importing at once and receive its constructor arguments later (:class:`PrestartedAgentLoopWorker`).

:func:`begin` starts both at the top of ``init_workers``; verl's replica (``HFReplica.launch_servers``) and
agent-loop manager (:class:`PrestartedAgentLoopManager`, set as verl's ``agent_loop_manager_class``) take them
over when verl gets to them: :func:`take_server` hands a server over only if it was started with exactly the
arguments the replica would give it, else the replica starts its own as before. :func:`release` stops whatever
was not taken. With several nodes (where verl places each process by the node of its worker) or another
rollout backend, nothing is prestarted for that part and verl's order stays.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf, open_dict
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker

from agentevolver.verl.cpu.hosting import hosts_rollout_server

__all__ = ["MANAGER_CLASS", "PrestartedAgentLoopManager", "PrestartedAgentLoopWorker", "begin", "release",
           "take_agent_workers", "take_server"]

logger = logging.getLogger(__name__)

#: verl's ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for a run whose workers were prestarted.
MANAGER_CLASS = f"{__name__}.PrestartedAgentLoopManager"
_MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


@dataclass
class _Server:
    """A prestarted rollout server and the arguments it was created with (the replica must give the same)."""

    handle: Any
    key: tuple[Any, ...]


@dataclass
class _Prestarted:
    """What :func:`begin` started and nobody has taken yet (one run per process at a time)."""

    servers: dict[str, _Server] = field(default_factory=dict)
    agent_workers: list[Any] = field(default_factory=list)


_pending = _Prestarted()


_KEY_PARTS = ("rollout config", "model config", "rollout mode", "replica rank", "node")


def server_key(config: Any, model_config: Any, rollout_mode: Any, replica_rank: int, node_id: str) -> tuple:
    """What an ``hf`` server is created from: the rollout config (verl's ``RolloutConfig``), the model config,
    the rollout mode, the replica's rank and its node. Equal keys = interchangeable servers."""
    model = OmegaConf.to_container(model_config, resolve=True) if isinstance(model_config, DictConfig) else model_config
    return (config, model, str(rollout_mode), int(replica_rank), str(node_id))


def _single_node() -> str | None:
    """The node id when the cluster has exactly one alive node with CPUs (verl places everything there)."""
    nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) > 0]
    return nodes[0] if len(nodes) == 1 else None


def begin(config: DictConfig) -> dict[str, int]:
    """Start the run's ``hf`` rollout servers and agent-loop worker processes now, where that is safe (see the
    module). Sets verl's ``agent_loop_manager_class`` to :data:`MANAGER_CLASS` when workers were started; a
    manager already set (the in-process one, :mod:`agentevolver.verl.in_process`, or the user's) starts no
    worker process here. Returns how many of each were started."""
    started = {"servers": 0, "agent_workers": 0}
    if not bool(OmegaConf.select(config, "trainer.prestart", default=False)):
        return started
    node_id = _single_node()
    if node_id is None or int(config.trainer.nnodes) != 1:
        return started
    rollout = config.actor_rollout_ref.rollout
    if OmegaConf.select(config, _MANAGER_KEY, default=None) in (None, "", MANAGER_CLASS):
        count = int(rollout.agent.num_workers)
        _pending.agent_workers = [
            ray.remote(PrestartedAgentLoopWorker).options(
                name=f"agent_loop_worker_{i}_{uuid.uuid4().hex[:8]}",  # verl's naming
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=True),
            ).remote()
            for i in range(count)
        ]
        with open_dict(config):
            OmegaConf.update(config, _MANAGER_KEY, MANAGER_CLASS, force_add=True)
        started["agent_workers"] = count
    # after the manager's key: the server is created from the rollout config verl's replica will hold
    if rollout.name == "hf" and bool(config.actor_rollout_ref.get("hybrid_engine", True)) \
            and not hosts_rollout_server(config):  # a server in the training worker starts with its model
        started["servers"] = _start_servers(config, node_id)
    return started


def _start_servers(config: DictConfig, node_id: str) -> int:
    """One ``hf`` server per replica, created as verl's replica would create it: the replicas are verl's own
    objects (their constructor only reads the config), so the replica count, the server's rollout config and
    its ``max_concurrency`` are verl's, not restated here."""
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.verl.cpu.rollout import HFReplica
    from agentevolver.verl.cpu.rollout_server import HFRolloutServer, server_actor_name

    gpus_per_node = int(config.trainer.n_gpus_per_node)
    first = HFReplica(replica_rank=0, config=config.actor_rollout_ref.rollout,
                      model_config=config.actor_rollout_ref.model, gpus_per_node=gpus_per_node)
    count = gpus_per_node * int(config.trainer.nnodes) // first.world_size  # verl's LLMServerManager
    for rank in range(count):
        replica = first if rank == 0 else HFReplica(
            replica_rank=rank, config=config.actor_rollout_ref.rollout, model_config=config.actor_rollout_ref.model,
            gpus_per_node=gpus_per_node)
        name = server_actor_name(rank, replica.name_suffix)
        handle = ray.remote(HFRolloutServer).options(
            name=name,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            max_concurrency=replica.max_concurrency,
        ).remote(config=replica.config, model_config=replica.model_config, rollout_mode=RolloutMode.HYBRID,
                 replica_rank=rank)
        _pending.servers[name] = _Server(handle, server_key(replica.config, replica.model_config,
                                                            RolloutMode.HYBRID, rank, node_id))
    return count


def take_server(name: str, key: tuple) -> Any | None:
    """The prestarted server called ``name`` if it was created from ``key`` (:func:`server_key`), else None
    (a server of that name with other arguments is stopped, so the caller can create its own)."""
    server = _pending.servers.pop(name, None)
    if server is None:
        return None
    if server.key == key:
        return server.handle
    differ = [part for part, mine, theirs in zip(_KEY_PARTS, server.key, key, strict=True) if mine != theirs]
    logger.warning("prestart: the rollout server %s was started with another %s than its replica's; starting "
                   "it again", name, " and ".join(differ))
    ray.kill(server.handle)
    return None


def take_agent_workers(count: int) -> list[Any] | None:
    """The prestarted agent-loop workers, if there are exactly ``count`` of them (verl's ``num_workers``)."""
    workers, _pending.agent_workers = _pending.agent_workers, []
    if len(workers) == count:
        return workers
    for handle in workers:
        ray.kill(handle)
    return None


def release() -> list[str]:
    """Stop what was prestarted and not taken (after ``init_workers``); returns what was stopped."""
    left = [*_pending.servers, *(f"agent-loop worker {i}" for i in range(len(_pending.agent_workers)))]
    for handle in [server.handle for server in _pending.servers.values()] + _pending.agent_workers:
        ray.kill(handle)
    _pending.servers.clear()
    _pending.agent_workers = []
    return left


class PrestartedAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker, started before its arguments exist: the process imports verl and the agent
    loop now; :meth:`setup` runs verl's constructor once the manager has the server client."""

    def __init__(self) -> None:
        import agentevolver.verl.agent_loop  # noqa: F401 - the episode code, imported while nothing waits

    def setup(self, *args: Any, **kwargs: Any) -> None:
        """verl's ``AgentLoopWorker.__init__`` with the manager's arguments."""
        AgentLoopWorker.__init__(self, *args, **kwargs)


class PrestartedAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager that takes over the workers :func:`begin` started (falls back to verl's own
    start when there are none, e.g. a manager created a second time)."""

    async def _init_agent_loop_workers(self) -> None:
        workers = take_agent_workers(int(self.rollout_config.agent.num_workers))
        if workers is None:
            await super()._init_agent_loop_workers()
            return
        await asyncio.gather(*[worker.setup.remote(self.config, self.llm_client, self.teacher_client,
                                                   self.reward_loop_worker_handles) for worker in workers])
        self.agent_loop_workers = workers
