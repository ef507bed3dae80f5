"""Start-up cluster checks (agentevolver.verl.cluster): every node reaches the services and reads the files.

With a real local Ray cluster and the real environment service: the per-node Ray task finds the live
service, names a dead URL with its config key and node, checks the model folder and the shared-run-folder
marker, and the TaskRunner wrapper lands on the driver's node. What needs several machines (which nodes
are used, a run folder one node cannot see, a copy that differs) is tested on the pure pieces with node
reports as the Ray tasks would return them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import env_service
from omegaconf import DictConfig, open_dict
from ports import free_port
from training_fixture import training_command, training_env, training_timeout

from agentevolver.config import load_config
from agentevolver.models import resolve_model_path
from agentevolver.verl.cluster import (
    ClusterCheckError,
    ClusterReport,
    Endpoint,
    NodeReport,
    PathCheck,
    check_cluster,
    endpoints_in_use,
    node_report,
    nodes_in_use,
    pin_to_driver_node,
    probe,
)


@pytest.fixture(scope="module")
def live_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("reach")) as running:
        yield running.url


@pytest.fixture(scope="module")
def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # a port nothing listens on


@pytest.fixture(scope="module")
def base_config() -> DictConfig:
    cfg, _ = load_config(["actor_rollout_ref.model.path=tiny-test"])
    return cfg


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    # address="local": a cluster of its own even if `ray start` runs on this machine
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def _set(base: DictConfig, values: dict[str, Any]) -> DictConfig:
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(base)
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


# ------------------------------------------------------------------------------------------ what is checked


def test_only_the_services_the_mechanisms_use(base_config: DictConfig) -> None:
    plain = endpoints_in_use(base_config)
    assert [(e.key, e.strict) for e in plain] == [("env_service.env_url", True)]
    assert plain[0].probe_url == "http://127.0.0.1:8080/healthz"

    overall, _ = load_config([], config_name="overall")
    keys = {e.key: e for e in endpoints_in_use(overall)}
    assert set(keys) == {"env_service.env_url", "memory.base_url", "llm.endpoints.local.base_url"}
    llm = keys["llm.endpoints.local.base_url"]
    assert llm.probe_url == "http://127.0.0.1:8010/v1/models" and not llm.strict
    for role in ("judge", "task_explorer", "task_summarizer", "task_filter", "task_grader"):
        assert role in llm.what

    clip = endpoints_in_use(_set(base_config, {"agent_flow.context_template": "self_clip"}))
    assert "context_clipper" in clip[-1].what


@pytest.mark.parametrize(("writer", "needs_writer"), [("llm", True), ("env", False)])
def test_the_task_writer_endpoint_is_checked_only_when_an_llm_writes(base_config: DictConfig, writer: str,
                                                                    needs_writer: bool) -> None:
    cfg = _set(base_config, {"task_manager.n": 1, "task_manager.writer": writer,
                             "env_service.env_type": "calc"})
    llm = [e for e in endpoints_in_use(cfg) if e.key.startswith("llm.endpoints.")]
    assert llm and "task_explorer" in llm[0].what
    assert ("task_summarizer" in llm[0].what) == needs_writer


@pytest.mark.parametrize(("source", "needs_judge"), [("llm", True), ("env", False)])
def test_the_judge_endpoint_is_checked_only_when_an_llm_labels_steps(base_config: DictConfig, source: str,
                                                                    needs_judge: bool) -> None:
    cfg = _set(base_config, {"attribution_driven_credit_assignment.enable": True,
                             "attribution_driven_credit_assignment.judge.source": source})
    judged = [e for e in endpoints_in_use(cfg) if "judge" in e.what]
    assert bool(judged) == needs_judge


@pytest.mark.parametrize(("env_type", "grader", "needs_grader"), [
    ("calc", "auto", False),  # calc's observations prove answers: auto is the reference grader, no LLM
    ("calc", "llm", True),
    ("codebox", "auto", True),  # codebox declares no proof: auto is the LLM grader
])
def test_the_synthetic_grader_endpoint_is_checked_only_when_an_llm_grades(
        base_config: DictConfig, env_type: str, grader: str, needs_grader: bool) -> None:
    cfg = _set(base_config, {"env_service.env_type": env_type, "task_manager.n": 1,
                             "task_manager.grader.synthetic_grader": grader,
                             "task_manager.grader.original_grader": "env"})
    llm = [e for e in endpoints_in_use(cfg) if e.key.startswith("llm.endpoints.")]
    assert llm and ("task_grader" in llm[0].what) == needs_grader


def test_probe_rules(live_env: str, dead_url: str) -> None:
    assert probe(f"{live_env}/healthz", strict=True, attempts=1) is None
    assert probe(f"{dead_url}/healthz", strict=True, attempts=2, backoff_s=0.1).startswith("cannot connect")
    assert probe(f"{live_env}/no-such-route", strict=True) == "answered HTTP 404 (expected 200)"
    assert probe(f"{live_env}/no-such-route", strict=False) is None  # something answers there


def test_nodes_in_use_follow_verls_placement(base_config: DictConfig) -> None:
    def node(node_id: str, cpu: float = 4, gpu: float = 0, alive: bool = True) -> dict[str, Any]:
        return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpu, "GPU": gpu}}

    nodes = [node("head", gpu=0), node("gpu1", gpu=8), node("cpu2"), node("cpu3"), node("dead", alive=False),
             node("nocpu", cpu=0)]
    two = _set(base_config, {"actor_rollout_ref.rollout.agent.num_workers": 2})
    # agent-loop workers round-robin over the first 2 CPU nodes; every GPU node; the checking node
    assert [n["NodeID"] for n in nodes_in_use(two, nodes, current="cpu3")] == ["head", "gpu1", "cpu3"]
    eight = _set(base_config, {"actor_rollout_ref.rollout.agent.num_workers": 8})
    assert [n["NodeID"] for n in nodes_in_use(eight, nodes)] == ["head", "gpu1", "cpu2", "cpu3"]


def test_problems_name_url_key_and_node() -> None:
    env = Endpoint("environment service", "env_service.env_url", "http://10.0.0.5:8080",
                   "http://10.0.0.5:8080/healthz", strict=True)
    marker = PathCheck("run folder", "trainer.default_local_dir", "/runs/x/.agentevolver/shared-check-1", marker="t")
    good = NodeReport(node_id="a" * 32, ip="10.0.0.5", hostname="head")
    bad = NodeReport(node_id="b" * 32, ip="10.0.0.7", hostname="gpu-02",
                     unreachable={env.probe_url: "cannot connect (connection refused)"},
                     unreadable={marker.path: "not visible: the run folder is not shared"})
    problems = ClusterReport([env], [marker], [good, bad]).problems()
    assert problems == [
        "environment service http://10.0.0.5:8080 (env_service.env_url) is not reachable from node 10.0.0.7, "
        "host gpu-02 (Ray node bbbbbbbbbbbb): cannot connect (connection refused) [GET http://10.0.0.5:8080/healthz]",
        "run folder /runs/x/.agentevolver/shared-check-1 (trainer.default_local_dir) on node 10.0.0.7, host gpu-02 "
        "(Ray node bbbbbbbbbbbb): not visible: the run folder is not shared",
    ]


def test_path_checks_on_a_node(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 8}))
    marker = tmp_path / "marker"
    marker.write_text("token-1")
    checks = [
        PathCheck("model folder", "actor_rollout_ref.model.path", str(model), fingerprint="0" * 64),
        PathCheck("model folder", "actor_rollout_ref.model.tokenizer_path", str(tmp_path / "absent")),
        PathCheck("run folder", "trainer.default_local_dir", str(marker), marker="token-2"),
        PathCheck("run folder", "trainer.default_local_dir", str(tmp_path / "no-marker"), marker="token-3"),
    ]
    report = node_report([], checks)
    assert "differs from the checking node's copy" in report.unreadable[str(model)]
    assert "does not exist on this node" in report.unreadable[str(tmp_path / "absent")]
    assert "another run's marker" in report.unreadable[str(marker)]
    assert report.unreadable[str(tmp_path / "no-marker")].startswith("not visible")


# ------------------------------------------------------------------------------------------ with Ray


def test_reachable_services_pass(ray_cluster: Any, base_config: DictConfig, live_env: str) -> None:
    model = str(resolve_model_path("tiny-test"))
    cfg = _set(base_config, {"env_service.env_url": live_env, "actor_rollout_ref.model.path": model})
    report = check_cluster(cfg, attempts=1)
    assert len(report.nodes) == 1 and report.problems() == []
    assert report.nodes[0].node_id == ray_cluster.get_runtime_context().get_node_id()
    assert [p.key for p in report.paths] == ["actor_rollout_ref.model.path"]
    assert report.paths[0].fingerprint  # compared by config.json content


def test_two_env_service_urls_one_unreachable_refuses_to_start(ray_cluster: Any, base_config: DictConfig,
                                                               live_env: str, dead_url: str) -> None:
    check_cluster(_set(base_config, {"env_service.env_url": live_env}), attempts=1)  # the live one passes
    with pytest.raises(ClusterCheckError) as err:
        check_cluster(_set(base_config, {"env_service.env_url": dead_url}), attempts=2)
    message = str(err.value)
    node_ip = ray_cluster.util.get_node_ip_address()
    assert message.startswith("cluster check failed (1 problem on 1 node); the run was not started:")
    assert f"environment service {dead_url} (env_service.env_url) is not reachable from node {node_ip}" in message
    assert "cannot connect" in message and live_env not in message


def test_degradable_services_down_on_every_node_are_a_warning(ray_cluster: Any, base_config: DictConfig,
                                                               live_env: str, dead_url: str, caplog) -> None:
    """Memory and LLM roles degrade the run by design (counted failures): down on every node is a warning;
    the environment service is not optional (test above)."""
    cfg = _set(base_config, {"env_service.env_url": live_env, "memory.base_url": dead_url,
                             "memory.enable_context_generator": True,
                             "attribution_driven_credit_assignment.enable": True,
                             "llm.endpoints.local.base_url": f"{dead_url}/v1"})
    with caplog.at_level("WARNING", logger="agentevolver.verl.cluster"):
        report = check_cluster(cfg, attempts=1)
    assert [e.key for e in report.down_everywhere()] == ["memory.base_url", "llm.endpoints.local.base_url"]
    warnings = [r.getMessage() for r in caplog.records]
    assert any(f"memory service {dead_url} (memory.base_url) answers on no node" in w for w in warnings)


def test_a_degradable_service_some_nodes_cannot_reach_is_a_problem() -> None:
    """Reached from one node but not another: a wrong address for part of the cluster, not a service that is
    down, so the run must not start."""
    memory = Endpoint("memory service", "memory.base_url", "http://127.0.0.1:8001", "http://127.0.0.1:8001/healthz",
                      strict=False, optional=True)
    head = NodeReport(node_id="a" * 32, ip="10.0.0.5", hostname="head")
    worker = NodeReport(node_id="b" * 32, ip="10.0.0.7", hostname="gpu-02",
                        unreachable={memory.probe_url: "cannot connect (connection refused)"})
    report = ClusterReport([memory], [], [head, worker])
    assert report.down_everywhere() == []
    assert report.problems() == [
        "memory service http://127.0.0.1:8001 (memory.base_url) is not reachable from node 10.0.0.7, host gpu-02 "
        "(Ray node bbbbbbbbbbbb): cannot connect (connection refused) [GET http://127.0.0.1:8001/healthz]"]
    assert ClusterReport([memory], [], [worker]).problems() == []  # down on the only node: a warning


def test_shared_run_folder_marker(ray_cluster: Any, base_config: DictConfig, live_env: str, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = _set(base_config, {"env_service.env_url": live_env, "trainer.default_local_dir": str(run_dir)})
    report = check_cluster(cfg, attempts=1, shared_run_dir=True)
    (marker,) = [p for p in report.paths if p.key == "trainer.default_local_dir"]
    assert marker.path.startswith(str(run_dir / ".agentevolver" / "shared-check-"))
    assert not Path(marker.path).exists()  # removed after the check
    # one node: nothing to share, no marker written
    assert not [p for p in check_cluster(cfg, attempts=1).paths if p.key == "trainer.default_local_dir"]


def test_task_runner_pinned_to_the_driver_node(ray_cluster: Any) -> None:
    @ray_cluster.remote(num_cpus=0)
    class WhereAmI:
        def node(self) -> str:
            return ray_cluster.get_runtime_context().get_node_id()

    here = ray_cluster.get_runtime_context().get_node_id()
    pinned = pin_to_driver_node(WhereAmI)
    assert ray_cluster.get(pinned.remote().node.remote()) == here
    assert ray_cluster.get(pinned.options(name="where-am-i").remote().node.remote()) == here


@training_timeout
def test_a_training_run_with_an_unreachable_service_refuses_to_start(dead_url: str, tmp_path: Path) -> None:
    """Through the entry point: the TaskRunner's check stops the run before any worker starts, naming the
    URL, its config key and the node (exit 2, no Ray traceback)."""
    import subprocess

    command = training_command(dead_url, tmp_path)
    done = subprocess.run(command, cwd=tmp_path, env=training_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    assert dead_url in done.stderr and "env_service.env_url" in done.stderr and "node" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "global_step_1").exists()
