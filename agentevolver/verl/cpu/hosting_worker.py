"""The training worker that hosts its replica's ``hf`` rollout server (``trainer.rollout_server=worker``; why and
when: :mod:`agentevolver.verl.cpu.hosting`).

:class:`HFHostingWorker` is verl's ``ActorRolloutRefWorker`` with two methods registered as verl's
``DIRECT_ROLLOUT_METHOD``: verl's fused worker class (``WorkerDict``, which holds the actor, rollout and reference
roles in one Ray actor) binds such methods of a rollout role under their own names, so they are called on the
worker's actor handle directly, not through the worker group's dispatch. The worker is a Ray *async* actor (verl's
``update_weights`` is a coroutine), so generation calls run concurrently on its event loop while the generator's
decode thread computes, as they do in the server's own actor.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from agentevolver.verl.cpu.rollout_server import HFRolloutServer, host, hosted_server

__all__ = ["HFHostingWorker"]


class HFHostingWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/reference worker, also serving its replica's rollout server from this process."""

    @register(dispatch_mode=Dispatch.DIRECT_ROLLOUT_METHOD, materialize_futures=False)
    async def start_hf_server(self, name: str, config: Any, model_config: Any, rollout_mode: Any,
                              replica_rank: int) -> dict[str, Any]:
        """Build the server ``name`` here (what :class:`HFReplica` would start as an actor, with the same
        arguments) and return its :meth:`~HFRolloutServer.ready` facts plus this worker's actor name and
        namespace, which the replica's :class:`HostedServerHandle` looks the worker up by."""
        if hosted_server(name) is None:
            host(name, HFRolloutServer(config=config, model_config=model_config, rollout_mode=rollout_mode,
                                       replica_rank=replica_rank))
        context = ray.get_runtime_context()
        info = await hosted_server(name).ready()
        return {**info, "worker_name": context.get_actor_name(), "namespace": context.namespace}

    @register(dispatch_mode=Dispatch.DIRECT_ROLLOUT_METHOD, materialize_futures=False)
    async def hf_server_call(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``HFRolloutServer.<method>(*args, **kwargs)`` on the server ``name`` hosted here (every server method
        is a coroutine)."""
        server = hosted_server(name)
        if server is None:
            raise RuntimeError(f"no rollout server {name!r} is hosted in this worker (start_hf_server first)")
        if method.startswith("_") or not callable(getattr(server, method, None)):
            raise AttributeError(f"the rollout server has no method {method!r}")
        return await getattr(server, method)(*args, **kwargs)
