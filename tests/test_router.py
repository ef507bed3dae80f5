"""``trainer.request_router: light`` (agentevolver/verl/router.py): verl's routing contract in a process that imports
no verl, loaded through verl's own ``rollout.router_config_path`` seam. Every training test routes through it."""

from __future__ import annotations

from collections import Counter

import pytest

from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.verl.router import ROUTER_YAML, StickyLeastLoadedRouter


def test_a_request_keeps_its_server_and_new_ones_go_where_fewest_are_in_flight() -> None:
    router = StickyLeastLoadedRouter({"a": "handle-a", "b": "handle-b"}, {"max_sticky": 2})
    first, handle = router.acquire_server("episode-1")
    assert handle == f"handle-{first}"
    other = "b" if first == "a" else "a"
    assert router.acquire_server("episode-2")[0] == other  # one in flight on `first`: the empty one
    assert router.acquire_server("episode-1")[0] == first  # the next turn: its server, though busier
    assert router.get_status()["servers"] == {first: 2, other: 1}
    router.release_server(first)
    router.release_server(first)
    router.release_server(first)  # more releases than acquires never go below zero
    assert router.get_inflight_count(first) == 0 and router.get_total_inflight() == 1
    router.acquire_server("episode-3")  # a third id: episode-2, the least recently used, is forgotten
    assert router.clear_sticky_cache()["cleared_entries"] == 2  # max_sticky


def test_a_removed_server_is_left_and_an_added_one_used() -> None:
    router = StickyLeastLoadedRouter({"a": 1})
    assert router.acquire_server("e")[0] == "a"
    router.add_servers({"b": 2})
    router.remove_servers(["a"])
    assert router.get_all_servers() == ["b"]
    assert router.acquire_server("e") == ("b", 2)  # its server is gone: routed anew
    router.release_server("a")  # a release for the removed server is ignored
    assert router.clear_sticky_cache() == {"cleared_entries": 1, "server_loads": {"b": 1}}
    router.remove_servers(["b"])
    with pytest.raises(RuntimeError, match="no server registered"):
        router.acquire_server("e")


def test_spread_over_equal_servers() -> None:
    router = StickyLeastLoadedRouter({"a": 1, "b": 2, "c": 3})
    picks = Counter(router.acquire_server(f"e{i}")[0] for i in range(30))
    assert picks == {"a": 10, "b": 10, "c": 10}  # always one of the least loaded


def test_main_ppo_points_verl_at_it_unless_the_run_chose_a_router() -> None:
    base = ["actor_rollout_ref.model.path=tiny-test"]
    assert prepare_config(compose_config(base)).actor_rollout_ref.rollout.router_config_path == str(ROUTER_YAML)
    verl_own = prepare_config(compose_config([*base, "trainer.request_router=verl"]))
    assert verl_own.actor_rollout_ref.rollout.router_config_path is None
    mine = prepare_config(compose_config([*base, "actor_rollout_ref.rollout.router_config_path=/my/router.yaml"]))
    assert mine.actor_rollout_ref.rollout.router_config_path == "/my/router.yaml"
    exact = prepare_config(compose_config([*base, "actor_rollout_ref.rollout.full_determinism=true"]))
    assert exact.actor_rollout_ref.rollout.router_config_path is None  # verl's balancer routes by request id
    with pytest.raises(ConfigError, match=r"trainer\.request_router: must be light or verl"):
        prepare_config(compose_config([*base, "trainer.request_router=fast"]))


def test_the_modules_a_server_handle_pulls_in_import_no_torch() -> None:
    """Unpickling an actor handle imports its class's module: the router receives the hf servers' handles, so
    the server's module (and the router's) must not import torch, transformers or verl at the top."""
    import subprocess
    import sys

    probe = ("import sys, agentevolver.verl.router, agentevolver.verl.cpu.rollout_server; "
             "print(sorted(m for m in ('torch', 'transformers', 'verl') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_verls_factory_starts_it_as_an_actor_that_imports_no_verl() -> None:
    import ray
    from verl.workers.rollout.router import get_router_handle

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        router = get_router_handle(servers={"s0": "handle-0"}, router_config_path=str(ROUTER_YAML))
        assert ray.get(router.require_acquire_fields.remote()) == []
        assert ray.get(router.acquire_server.remote(request_id="r1")) == ("s0", "handle-0")
        loaded = ray.get(router.__ray_call__.remote(
            lambda self: sorted(name for name in __import__("sys").modules if name in ("verl", "torch", "transformers"))))
        assert loaded == []
    finally:
        ray.shutdown()
