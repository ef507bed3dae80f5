"""Start-up checks for a run spread over a Ray cluster: can every node reach the services and read the files?

verl places its agent-loop workers round-robin over every alive node (``AgentLoopManager``), its training
and rollout workers on the GPU nodes, and our TaskRunner wherever Ray puts it. A service URL that one node
cannot reach (the default ``127.0.0.1`` on a second node) does not fail anything: its episodes end as
counted env errors and training goes on with garbage. A run folder that is not shared splits checkpoints
over the nodes' disks. So before any worker starts, :func:`check_cluster` runs one small Ray task on each
node the run will use, pinned there, which

* GETs each service the config uses (environment ``/healthz``; memory ``/healthz``; each LLM endpoint a
  role in use names, ``/models``), from that node, with the clients' own proxy settings;
* checks the model folder (and tokenizer folder, custom reward file) exists there with the same
  ``config.json`` as on the checking node;
* on a cluster of several nodes, when checkpoints are written, checks the run folder
  (``trainer.default_local_dir``) is one shared folder: a marker written from the checking node must be
  visible, with its content, from every other node;

and raises one :class:`ClusterCheckError` (a :class:`ConfigError`) listing every problem with the URL or
path, the config key and the node (IP, host name, Ray node id). :func:`pin_to_driver_node` keeps the
TaskRunner (which writes rollout dumps, metrics, synthetic tasks and the trainer's checkpoint bookkeeping)
on the node ``main_ppo`` was started on. :func:`drop_local_ray_sizes` lets a run whose preset sizes a local Ray
(the CPU preset's ``num_cpus``/``num_gpus``) join a running cluster. Multi-node walk-through: docs/backends.md,
"Several nodes"; ``tests/test_multinode.py`` trains on a 2-node cluster on one machine.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import OmegaConf

from agentevolver.errors import ConfigError

__all__ = [
    "ClusterCheckError",
    "ClusterReport",
    "Endpoint",
    "NodeReport",
    "PathCheck",
    "check_cluster",
    "drop_local_ray_sizes",
    "endpoints_in_use",
    "nodes_in_use",
    "pin_to_driver_node",
    "probe",
]

logger = logging.getLogger(__name__)

#: Hosts that mean "this machine": right on one node, wrong from every other.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0"})
MARKER_DIR = ".agentevolver"


class ClusterCheckError(ConfigError):
    """A node cannot reach a service or read a file the run needs; the message names each one."""


@dataclass(frozen=True)
class Endpoint:
    """One service URL the run uses: what it is, the config key it comes from, and how it is probed.

    ``strict``: the probe must answer 200 (services with a known health route); otherwise any HTTP answer
    below 500 proves the node reaches a server there (an API may want a key for ``/models``). ``optional``: the
    run degrades without it (memory, LLM roles), so it only fails the check when some nodes reach it and
    others do not (a wrong address for part of the cluster); down on every node is a warning.
    """

    what: str
    key: str
    url: str
    probe_url: str
    strict: bool
    optional: bool = False


@dataclass(frozen=True)
class PathCheck:
    """A file or folder a node must read (``fingerprint``: sha256 of the file to compare, or of the folder's
    ``config.json``; "" = only existence) or, with ``marker``, the shared-folder marker and its content."""

    what: str
    key: str
    path: str
    fingerprint: str = ""
    marker: str = ""


@dataclass
class NodeReport:
    """What one node saw."""

    node_id: str
    ip: str
    hostname: str = ""
    unreachable: dict[str, str] = field(default_factory=dict)  # probe_url -> reason
    unreadable: dict[str, str] = field(default_factory=dict)  # path -> reason

    @property
    def where(self) -> str:
        host = f", host {self.hostname}" if self.hostname else ""
        return f"node {self.ip}{host} (Ray node {self.node_id[:12]})"


@dataclass
class ClusterReport:
    """The nodes checked and what each saw; :meth:`problems` is empty when the run may start."""

    endpoints: list[Endpoint]
    paths: list[PathCheck]
    nodes: list[NodeReport]

    def down_everywhere(self) -> list[Endpoint]:
        """Degradable services (memory, LLM roles) that no node reaches: the service is down, not a wrong URL
        for some nodes, and the run goes on without it as documented (retrieval / summaries / judge failures
        are counted); :func:`check_cluster` logs a warning for each."""
        return [endpoint for endpoint in self.endpoints if endpoint.optional and self.nodes
                and all(endpoint.probe_url in node.unreachable for node in self.nodes)]

    def problems(self) -> list[str]:
        lines: list[str] = []
        skipped = {endpoint.probe_url for endpoint in self.down_everywhere()}
        for node in self.nodes:
            for endpoint in self.endpoints:
                if endpoint.probe_url in skipped:
                    continue
                reason = node.unreachable.get(endpoint.probe_url)
                if reason is not None:
                    lines.append(f"{endpoint.what} {endpoint.url} ({endpoint.key}) is not reachable from "
                                 f"{node.where}: {reason} [GET {endpoint.probe_url}]")
            for check in self.paths:
                reason = node.unreadable.get(check.path)
                if reason is not None:
                    lines.append(f"{check.what} {check.path} ({check.key}) on {node.where}: {reason}")
        return lines


# ------------------------------------------------------------------------------------------ joining a cluster

#: ``ray_kwargs.ray_init`` keys that size or tune a Ray the driver starts; Ray refuses them when it joins a
#: running one.
LOCAL_RAY_SIZES = ("num_cpus", "num_gpus", "_system_config")


def ray_address(cfg: Any) -> str:
    """The Ray cluster this run joins: ``ray_kwargs.ray_init.address``, else ``RAY_ADDRESS``, else ``""`` (a Ray
    the driver starts itself). ``ray.init`` reads the two in that order, so every choice made before it (sizes
    to leave out, where the TaskRunner runs) reads them here the same way."""
    return str(OmegaConf.select(cfg, "ray_kwargs.ray_init.address", default=None) or os.environ.get("RAY_ADDRESS")
               or "")


def drop_local_ray_sizes(cfg: Any) -> dict[str, Any]:
    """Leave out ``ray_kwargs.ray_init.num_cpus``/``num_gpus``/``_system_config`` when the run joins a running
    Ray cluster.

    A cluster of several nodes is started with ``ray start`` on each node, which declares that node's CPUs and
    GPUs; the driver joins it through ``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``, and ``ray.init`` then
    refuses any size ("When connecting to an existing cluster, num_cpus and num_gpus must not be provided") and
    any ``_system_config``. The CPU preset sets all three for the one-machine case, so a multi-node CPU run
    would stop there. Changes ``cfg`` in place; returns ``{"address", "keys"}`` of what was dropped, empty when nothing was.
    """
    from omegaconf import open_dict

    ray_init = OmegaConf.select(cfg, "ray_kwargs.ray_init", default=None)
    if ray_init is None:
        return {}
    address = ray_address(cfg)
    if address in ("", "local"):
        return {}
    keys = [f"ray_kwargs.ray_init.{key}" for key in LOCAL_RAY_SIZES if ray_init.get(key) is not None]
    if not keys:
        return {}
    with open_dict(cfg):
        for key in LOCAL_RAY_SIZES:
            if key in ray_init:
                ray_init[key] = None
    return {"address": address, "keys": keys}


# ------------------------------------------------------------------------------------------ what to check


def _select(config: Any, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(config, key, default=default)
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _join(base: str, route: str) -> str:
    return base.rstrip("/") + route


def _roles_in_use(config: Any) -> list[str]:
    """LLM roles the trainer, task runner or agent-loop workers call with this config (the experience
    summariser is called by the memory service, from its own host)."""
    from agentevolver.module.adv_processor.stage import adca_on

    roles: list[str] = []
    if adca_on(_select(config, "algorithm.adv_estimator", "grpo"),
               _select(config, "attribution_driven_credit_assignment.enable", False)) and \
            _select(config, "attribution_driven_credit_assignment.judge.source", "llm") == "llm":
        roles.append("judge")  # source env: the environment service labels the steps, no LLM is called
    n = int(_select(config, "task_manager.n", 0) or 0)
    if n > 0:
        roles.append("task_explorer")
        if _select(config, "task_manager.writer", "llm") == "llm":
            roles.append("task_summarizer")  # writer env: the environment renders the tasks
        if "llm_feasibility" in (_select(config, "task_manager.post_filters", []) or []):
            roles.append("task_filter")
    graders = {_select(config, "task_manager.grader.original_grader")}
    if n > 0 or float(_select(config, "task_manager.mixture.synthetic_data_ratio", 0) or 0) > 0:
        from agentevolver.module.task_manager.profile import resolve_synthetic_grader

        graders.add(resolve_synthetic_grader(str(_select(config, "task_manager.grader.synthetic_grader")),
                                             str(_select(config, "env_service.env_type")),
                                             _select(config, "task_manager.env_profile")))
    if "llm" in graders:
        roles.append("task_grader")
    if _select(config, "agent_flow.context_template") == "self_clip":
        roles.append("context_clipper")
    return roles


def _memory_in_use(config: Any) -> bool:
    return bool(
        _select(config, "memory.enable_context_generator", False)
        or _select(config, "memory.enable_summarizer", False)
        or _select(config, "exp_manager.init_exp_before_training", False)
        or _select(config, "exp_manager.train_rollout_mode", "woexp") != "woexp"
        or _select(config, "exp_manager.val_rollout_mode", "woexp") != "woexp"
    )


def endpoints_in_use(config: Any) -> list[Endpoint]:
    """Every service URL this config makes the run call, once each (see the module docstring)."""
    endpoints = [Endpoint("environment service", "env_service.env_url", str(config.env_service.env_url),
                          _join(str(config.env_service.env_url), "/healthz"), strict=True)]
    if _memory_in_use(config):
        base = str(config.memory.base_url)
        endpoints.append(Endpoint("memory service", "memory.base_url", base, _join(base, "/healthz"), strict=False,
                                  optional=True))
    by_endpoint: dict[str, list[str]] = {}
    for role in _roles_in_use(config):
        name = _select(config, f"llm.roles.{role}")
        if name is not None:
            by_endpoint.setdefault(str(name), []).append(role)
    for name, roles in by_endpoint.items():
        base = _select(config, f"llm.endpoints.{name}.base_url")
        if base:
            endpoints.append(Endpoint(f"LLM endpoint {name!r} (roles {', '.join(roles)})",
                                      f"llm.endpoints.{name}.base_url", str(base), _join(str(base), "/models"),
                                      strict=False, optional=True))
    seen: set[str] = set()
    return [e for e in endpoints if not (e.probe_url in seen or seen.add(e.probe_url))]


def _fingerprint(path: Path) -> str:
    target = path / "config.json" if path.is_dir() else path
    try:
        return hashlib.sha256(target.read_bytes()).hexdigest()
    except OSError:
        return ""


def _paths_to_check(config: Any) -> list[PathCheck]:
    """Local files every node must read with the same content (hub ids and hdfs:// paths are skipped)."""
    checks: list[PathCheck] = []
    for key, what in (("actor_rollout_ref.model.path", "model folder"),
                      ("actor_rollout_ref.model.tokenizer_path", "tokenizer folder"),
                      ("reward.custom_reward_function.path", "custom reward file")):
        value = _select(config, key)
        if not value or "://" in str(value):
            continue
        path = Path(str(value)).expanduser()
        if not path.exists():  # not a local path here (a hub id): each node resolves it itself
            continue
        checks.append(PathCheck(what, key, str(path.resolve()), fingerprint=_fingerprint(path)))
    return checks


def _needs_shared_run_dir(config: Any) -> bool:
    """Checkpoints are written by every training rank and read back on resume: the folder must be shared."""
    save_freq = _select(config, "trainer.save_freq", -1)
    return save_freq is not None and int(save_freq) > 0


# ------------------------------------------------------------------------------------------ on a node


def probe(url: str, *, strict: bool, timeout_s: float = 5.0, attempts: int = 3, backoff_s: float = 1.0) -> str | None:
    """GET ``url``; None when it answers as expected, else the last reason (after ``attempts`` tries)."""
    import httpx

    reason = "not tried"
    for attempt in range(max(1, attempts)):
        if attempt:
            time.sleep(backoff_s)
        try:
            response = httpx.get(url, timeout=timeout_s)
        except httpx.ConnectError as err:
            reason = f"cannot connect ({err or 'connection refused'})"
            continue
        except httpx.TimeoutException:
            reason = f"no answer within {timeout_s:g} s"
            continue
        except httpx.HTTPError as err:
            reason = f"{type(err).__name__}: {err}"
            continue
        if response.status_code == 200 or (not strict and response.status_code < 500):
            return None
        reason = f"answered HTTP {response.status_code}" + (" (expected 200)" if strict else "")
        if response.status_code < 500:
            return reason  # a definite answer: retrying will not change it
    return reason


def _read_path(check: PathCheck) -> str | None:
    path = Path(check.path)
    if check.marker:
        try:
            seen = path.read_text()
        except OSError:
            return ("not visible: the run folder is not shared with the node that wrote it; put "
                    "trainer.default_local_dir on a filesystem every node mounts at the same path")
        return None if seen == check.marker else "holds another run's marker: the path is not one shared folder"
    if not path.exists():
        return "does not exist on this node: put it on a shared filesystem or copy it to the same path everywhere"
    if check.fingerprint and _fingerprint(path) != check.fingerprint:
        return "differs from the checking node's copy (config.json / file content): use one shared copy"
    return None


def node_report(endpoints: Sequence[Endpoint], paths: Sequence[PathCheck], timeout_s: float = 5.0,
                attempts: int = 3) -> NodeReport:
    """Run every probe and path check here (the body of the per-node Ray task)."""
    node_id, ip = "local", "?"
    try:
        import ray

        if ray.is_initialized():
            node_id, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
    except Exception:  # outside Ray (unit tests): name the host only
        pass
    report = NodeReport(node_id=node_id, ip=ip, hostname=socket.gethostname())
    with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
        reasons = pool.map(lambda e: probe(e.probe_url, strict=e.strict, timeout_s=timeout_s, attempts=attempts),
                           endpoints)
        for endpoint, reason in zip(endpoints, reasons, strict=True):
            if reason is not None:
                report.unreachable[endpoint.probe_url] = reason
    for check in paths:
        reason = _read_path(check)
        if reason is not None:
            report.unreadable[check.path] = reason
    return report


# ------------------------------------------------------------------------------------------ the cluster


def nodes_in_use(config: Any, nodes: Sequence[Mapping[str, Any]] | None = None,
                 current: str | None = None) -> list[Mapping[str, Any]]:
    """The alive nodes this run uses: those verl places agent-loop workers on (round-robin over alive nodes
    with CPUs, ``rollout.agent.num_workers`` of them), every node with GPUs (training and rollout workers),
    and ``current`` (the checking node: the TaskRunner's)."""
    if nodes is None:
        import ray

        nodes = ray.nodes()
    alive = [node for node in nodes if node.get("Alive")]
    cpu_nodes = [node for node in alive if node.get("Resources", {}).get("CPU", 0) > 0]
    workers = int(_select(config, "actor_rollout_ref.rollout.agent.num_workers", 8) or 8)
    wanted = {node["NodeID"] for node in cpu_nodes[: max(1, workers)]}
    wanted |= {node["NodeID"] for node in alive if node.get("Resources", {}).get("GPU", 0) > 0}
    if current:
        wanted.add(current)
    return [node for node in alive if node["NodeID"] in wanted]


def _loopback_hint(endpoints: Sequence[Endpoint], several: bool) -> str:
    if not several:
        return ""
    loopback = [e for e in endpoints if (urlsplit(e.url).hostname or "") in LOOPBACK]
    if not loopback:
        return ""
    keys = ", ".join(e.key for e in loopback)
    verb = "points" if len(loopback) == 1 else "point"
    return (f"\n{keys} {verb} at this machine (127.0.0.1 / localhost), which on every other node is that node: "
            "run the service on an address the nodes share and set the URL to it (docs/backends.md, \"Several "
            "nodes\")")


def check_cluster(config: Any, *, timeout_s: float = 5.0, attempts: int = 3, node_timeout_s: float = 180.0,
                  nodes: Sequence[Mapping[str, Any]] | None = None,
                  shared_run_dir: bool | None = None) -> ClusterReport:
    """Run the checks on every node in use (one Ray task pinned per node); raise :class:`ClusterCheckError`
    naming each unreachable URL / unreadable path with its node, else return the report.

    Call it inside the Ray cluster before any worker starts (the TaskRunner, after config validation).
    ``shared_run_dir``: check the run folder is shared (None = when several nodes are used and
    ``trainer.save_freq`` > 0). ``nodes``: ``ray.nodes()``-style entries to choose from (default: the cluster's).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    current = ray.get_runtime_context().get_node_id()
    used = nodes_in_use(config, nodes, current)
    endpoints = endpoints_in_use(config)
    paths = _paths_to_check(config)
    several = len(used) > 1
    marker_file: Path | None = None
    if shared_run_dir is None:
        shared_run_dir = several and _needs_shared_run_dir(config)
    if shared_run_dir:
        run_dir = Path(str(config.trainer.default_local_dir)).expanduser().absolute()
        marker_file = run_dir / MARKER_DIR / f"shared-check-{uuid.uuid4().hex}"
        marker_file.parent.mkdir(parents=True, exist_ok=True)
        token = f"{current}:{uuid.uuid4().hex}"
        marker_file.write_text(token)
        paths = [*paths, PathCheck("run folder", "trainer.default_local_dir", str(marker_file), marker=token)]
    task = ray.remote(num_cpus=0, max_retries=0)(node_report)
    try:
        refs = {
            node["NodeID"]: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
            .remote(endpoints, paths, timeout_s, attempts)
            for node in used
        }
        reports: list[NodeReport] = []
        for node in used:
            try:
                reports.append(ray.get(refs[node["NodeID"]], timeout=node_timeout_s))
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as err:
                missing = NodeReport(node_id=node["NodeID"], ip=str(node.get("NodeManagerAddress", "?")),
                                     hostname=str(node.get("NodeManagerHostname", "")))
                for endpoint in endpoints:
                    missing.unreachable[endpoint.probe_url] = f"the check did not run on the node ({type(err).__name__})"
                reports.append(missing)
    finally:
        if marker_file is not None:
            marker_file.unlink(missing_ok=True)
    report = ClusterReport(endpoints=endpoints, paths=paths, nodes=reports)
    problems = report.problems()
    if problems:
        raise ClusterCheckError(
            f"cluster check failed ({len(problems)} problem{'s' if len(problems) > 1 else ''} on {len(used)} "
            f"node{'s' if several else ''}); the run was not started:\n"
            + "\n".join(f"  {line}" for line in problems) + _loopback_hint(endpoints, several))
    for endpoint in report.down_everywhere():
        logger.warning("%s %s (%s) answers on no node; the run goes on without it (its failures are counted)",
                       endpoint.what, endpoint.url, endpoint.key)
    if several:
        hint = _loopback_hint(endpoints, several)
        if hint:
            logger.warning("every node reached the services, but%s", hint.replace("\n", " "))
    logger.info("cluster check passed: %d node(s), %d service(s), %d path(s)", len(used), len(endpoints), len(paths))
    return report


class _PinnedActorClass:
    """``actor_class`` whose ``.remote()`` / ``.options()`` place the actor on the node that calls them."""

    def __init__(self, actor_class: Any) -> None:
        self._actor_class = actor_class

    def _here(self) -> dict[str, Any]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                                                      soft=False)}

    def options(self, **options: Any) -> Any:
        return self._actor_class.options(**{**self._here(), **options})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._actor_class.options(**self._here()).remote(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._actor_class, name)


def pin_to_driver_node(actor_class: Any) -> Any:
    """Wrap a ``@ray.remote`` class so verl's ``run_ppo`` starts it on the driver's node (where
    ``python -m agentevolver.main_ppo`` runs): ``run_ppo(cfg, task_runner_class=pin_to_driver_node(TaskRunner))``.
    The node must offer the actor's CPU (the head node of a cluster started with ``ray start --head`` does)."""
    return _PinnedActorClass(actor_class)

