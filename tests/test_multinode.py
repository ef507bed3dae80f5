"""Several nodes: a 2-node Ray cluster on one machine, one training run over both (issue 45, part 3).

Two raylets (``ray.cluster_utils.Cluster``, each with one logical GPU: one FSDP rank and its rollout server per
node) in a Ray temp folder of their own, so no other Ray instance on the machine is touched or joined. The runs
go through the real entry point, ``python -m agentevolver.main_ppo``, joining the cluster with
``+ray_kwargs.ray_init.address`` (the preset's local Ray sizes are then left out, see
``agentevolver.verl.cluster.drop_local_ray_sizes``):

* a GRPO step of tiny-test with ``trainer.nnodes=2 trainer.n_gpus_per_node=1``: FSDP world size 2 (a checkpoint
  shard per rank), a rollout server on each node, an agent-loop worker on each node (``rollout.agent.num_workers=2``,
  verl places them round-robin over the nodes), checked in the cluster's actor table;
* a second run resumed from that step-1 checkpoint (both ranks load their shard) trains step 2 on the epoch's
  next tasks (the dataloader's position came back);
* the cluster check: a node whose HTTP goes through a proxy that does not answer (``ALL_PROXY`` in its raylet's
  environment, which its workers inherit; Ray's own gRPC does not read that variable) cannot reach the
  environment service that the head node reaches; the run stops before any worker starts (exit 2), naming the
  URL, its config key and that node.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import env_service
from ports import free_port
from training_fixture import (
    checksum_reward,
    dumped_tasks,
    resume_from,
    run_training,
    training_command,
    training_timeout,
)

from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout

#: Logical sizes of each node. A node's training rank takes a placement-group bundle of 3 CPUs and its GPU; the
#: rollout server and the agent-loop worker placed there need one CPU each to start, the head also the TaskRunner
#: and the reward-loop worker (the CPU preset's ``num_cpus: 8`` for one node, config/backend/cpu.yaml).
HEAD = {"num_cpus": 8, "num_gpus": 1}
SECOND = {"num_cpus": 6, "num_gpus": 1}
#: Object store of each node: tiny-test's weights and batches are a few MiB.
OBJECT_STORE_BYTES = 256 * 1024 * 1024


@dataclass
class TwoNodes:
    """A running 2-node cluster: its GCS address, the head node's id and the second node (replaceable)."""

    cluster: Any
    address: str
    head_id: str
    second: Any

    def actors(self) -> list[dict[str, Any]]:
        """Every actor the cluster has seen (dead ones too): name, class, state and node."""
        return list(self.cluster.global_state.actor_table(None).values())


def _add_node(cluster: Any, sizes: dict[str, int], env_vars: dict[str, str] | None = None) -> Any:
    return cluster.add_node(**sizes, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
                            env_vars=env_vars)


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodes]:
    from ray.cluster_utils import Cluster

    # A Ray temp folder of this cluster's own (short: Ray's socket paths must stay under 108 bytes): its session
    # files and its "current cluster" address file stay out of /tmp/ray, where other Ray instances keep theirs.
    temp = tempfile.mkdtemp(prefix="ae2n-", dir="/tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", temp)
        cluster = Cluster(initialize_head=True, head_node_args={
            **HEAD, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False,
            "temp_dir": os.path.join(temp, "ray")})  # GCS and raylets on ports of their own choosing
        try:
            second = _add_node(cluster, SECOND)
            cluster.wait_for_nodes()
            yield TwoNodes(cluster=cluster, address=cluster.address, head_id=cluster.head_node.node_id,
                           second=second)
        finally:
            cluster.shutdown()
            shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("multinode")) as running:
        yield running.url


def two_node_command(service: str, run_dir: Path, address: str, *extra: str) -> list[str]:
    """The trainer tests' tiny-test run over the 2-node cluster: one training rank per node, an agent-loop worker
    per node."""
    return training_command(
        service, run_dir,
        "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        # 4 samples per step over 2 ranks: 2 per rank, one GRPO group (verl balances whole groups over the ranks
        # with shared prompts on), one micro-batch
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"+ray_kwargs.ray_init.address={address}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        *checksum_reward(run_dir),
        *extra,
    )



def console_of(run_dir: Path, done: Any) -> str:
    log = run_dir / "run" / "console.log"
    return done.stdout + done.stderr + (log.read_text(errors="replace") if log.exists() else "")


def nodes_of(actors: list[dict[str, Any]], name: str) -> set[str]:
    """The nodes the actors whose name matches ``name`` ran on (of the job that ran last)."""
    found = [a for a in actors if re.fullmatch(name, a.get("Name") or "")]
    latest = max(a["JobID"] for a in found)
    return {a["Address"]["NodeID"] for a in found if a["JobID"] == latest}


def test_joining_a_running_cluster_leaves_out_the_local_ray_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray refuses num_cpus/num_gpus when ray.init joins a running cluster; the CPU preset sets both."""
    from agentevolver.config import compose_config
    from agentevolver.verl.cluster import drop_local_ray_sizes

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert drop_local_ray_sizes(compose_config([])) == {}  # a local Ray: sizes kept
    assert drop_local_ray_sizes(compose_config(["+ray_kwargs.ray_init.address=local"])) == {}
    cfg = compose_config(["+ray_kwargs.ray_init.address=10.0.0.1:6379"])
    assert drop_local_ray_sizes(cfg) == {"address": "10.0.0.1:6379",
                                         "keys": ["ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.num_gpus",
                                                  "ray_kwargs.ray_init._system_config"]}
    assert cfg.ray_kwargs.ray_init.num_cpus is None and cfg.ray_kwargs.ray_init.num_gpus is None
    assert cfg.ray_kwargs.ray_init._system_config is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert drop_local_ray_sizes(compose_config([]))["address"] == "10.0.0.1:6379"


def test_the_cluster_address_is_read_as_ray_init_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """One reading for every choice made before ``ray.init``: the config's address first, then ``RAY_ADDRESS``."""
    from agentevolver.config import compose_config
    from agentevolver.verl.cluster import ray_address
    from agentevolver.verl.driver_runner import runs_in_driver

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(compose_config([])) == ""
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert ray_address(compose_config([])) == "ray://head:10001"
    cfg = compose_config(["+ray_kwargs.ray_init.address=10.0.0.1:6379"])
    assert ray_address(cfg) == "10.0.0.1:6379"  # the config wins over the environment, as in ray.init
    assert runs_in_driver(cfg) and not runs_in_driver(compose_config([]))


def test_two_nodes_train_with_fsdp_world_size_2_and_resume_from_step_1(two_nodes: TwoNodes, service: str,
                                                                      tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    # one step, then a resumed run trains step 2 (each 2-rank step costs ~15-30 s on 2 cores)
    done = run_training(two_node_command(service, first, two_nodes.address, "trainer.total_training_steps=1"), first)
    output = console_of(first, done)
    assert done.returncode == 0, output[-8000:]
    assert "joining the Ray cluster" in done.stderr  # the preset's local Ray sizes were left out

    steps = read_metrics(first / "run" / "metrics.jsonl")
    assert sorted(steps) == [1], sorted(steps)
    assert steps[1]["actor/grad_norm"] > 0 and steps[1]["episode/count"] == 4
    # FSDP world size 2: one model and one optimizer shard per rank
    shards = sorted(p.name for p in (first / "run" / "global_step_1" / "actor").glob("*world_size_*_rank_*.pt"))
    assert shards == [f"{kind}_world_size_2_rank_{rank}.pt" for kind in ("extra_state", "model", "optim")
                      for rank in (0, 1)], shards

    both = {two_nodes.head_id, two_nodes.second.node_id}
    actors = two_nodes.actors()
    assert nodes_of(actors, r"agent_loop_worker_\d+_\w+") == both  # an agent-loop worker on each node
    assert nodes_of(actors, r"hf_server_\d+_0") == both  # a training rank and its rollout server on each node
    # the check ran on both nodes: every node reached the service, and it said the loopback URL is right only
    # because both nodes are this one machine
    assert "every node reached the services, but env_service.env_url points at this machine" in output, output[-6000:]

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    done = run_training(two_node_command(service, resumed, two_nodes.address, *resume_from(first, 1)), resumed)
    assert done.returncode == 0, console_of(resumed, done)[-8000:]
    steps = read_metrics(resumed / "run" / "metrics.jsonl")
    assert sorted(steps) == [2], sorted(steps)  # both ranks loaded step 1's shards; step 2 trained
    assert steps[2]["actor/grad_norm"] > 0
    # the dataloader's position came back too: step 2 drew the epoch's next tasks, not step 1's again
    assert set(dumped_tasks(resumed, 2)).isdisjoint(dumped_tasks(first, 1)), (dumped_tasks(resumed, 2),
                                                                              dumped_tasks(first, 1))
    shards = sorted(p.name for p in (resumed / "run" / "global_step_2" / "actor").glob("model_world_size_*"))
    assert shards == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]


def test_a_service_one_node_cannot_reach_stops_the_run(two_nodes: TwoNodes, service: str, tmp_path: Path) -> None:
    """The second node is replaced by one whose HTTP goes through a dead proxy: the head reaches the service, that
    node does not. The TaskRunner's cluster check stops the run, before any worker starts, naming the node."""
    dead_proxy = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cluster = two_nodes.cluster
    cluster.remove_node(two_nodes.second)
    blocked = _add_node(cluster, SECOND, env_vars={"ALL_PROXY": dead_proxy, "all_proxy": dead_proxy, "NO_PROXY": "",
                                                   "no_proxy": ""})
    try:
        cluster.wait_for_nodes()
        done = run_training(two_node_command(service, tmp_path, two_nodes.address), tmp_path)
        assert done.returncode == 2, console_of(tmp_path, done)[-8000:]
        message = done.stderr
        assert "cluster check failed (1 problem on 2 nodes)" in message, message[-4000:]
        assert (f"environment service {service} (env_service.env_url) is not reachable from node" in message
                and f"(Ray node {blocked.node_id[:12]})" in message), message[-4000:]
        assert f"(Ray node {two_nodes.head_id[:12]})" not in message  # the head reaches it
        assert "Traceback" not in message
        assert not (tmp_path / "run" / "global_step_1").exists()
    finally:
        cluster.remove_node(blocked)
        two_nodes.second = _add_node(cluster, SECOND)
        cluster.wait_for_nodes()
