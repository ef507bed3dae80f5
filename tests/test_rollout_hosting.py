"""``trainer.rollout_server`` (agentevolver/verl/cpu/hosting.py): the ``hf`` rollout server as a Ray actor of its
own (the default), or inside the training worker's process (``worker``) where nothing else computes there while
episodes generate.

Here the choice and the handle that stands for a hosted server. Training through a hosted server end to end:
tests/test_main_ppo.py's baseline run (``trainer.rollout_server=worker``: verl bound the worker's server methods,
no server process printed a line, and step 2's rollout log-probs match the trainer's, so the in-process weight
sync worked); its attributed run checks the default's server process. tests/test_lora.py checks an in-process
LoRA base sync keeps no trainer storage.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.verl.cpu.hosting import hosts_rollout_server
from agentevolver.verl.cpu.rollout_server import HostedServerHandle


def _config(*overrides: str):
    return compose_config(["actor_rollout_ref.model.path=tiny-test", *overrides], config_name="quickstart")


def test_the_server_is_an_actor_unless_the_worker_is_asked_to_host_it() -> None:
    cfg = _config()
    assert cfg.trainer.rollout_server == "actor" and cfg.actor_rollout_ref.rollout.name == "hf"
    assert not hosts_rollout_server(cfg)
    assert hosts_rollout_server(_config("trainer.rollout_server=worker"))


@pytest.mark.parametrize(("override", "named"), [
    ("trainer.mode=async", "trainer.mode is async"),
    ("trainer.nnodes=2", "trainer.nnodes is 2"),
    ("trainer.use_v1=true", "trainer.use_v1 is true"),
    ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.hybrid_engine is false"),
    ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.name is 'vllm'")])
def test_worker_where_it_cannot_run_says_why_and_what_to_set(override: str, named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        hosts_rollout_server(_config("trainer.rollout_server=worker", override))
    assert named in str(raised.value) and "trainer.rollout_server=actor" in str(raised.value)


def test_a_bad_choice_is_named_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.rollout_server: must be one of actor, worker; got 'gpu'"):
        prepare_config(_config("trainer.rollout_server=gpu"))


def test_the_handle_crosses_processes_as_names_and_unpickles_without_torch() -> None:
    """The request router receives every server handle and passes it on; unpickling verl's worker handle there
    would import verl and torch (the module of the actor's class), so the handle travels as names and looks the
    worker up on its first call."""
    handle = HostedServerHandle("abc123WorkerDict_0:0", "job-namespace", "hf_server_0_0")
    assert repr(handle) == "HostedServerHandle('hf_server_0_0' in 'abc123WorkerDict_0:0')"
    with pytest.raises(AttributeError):
        handle._private  # noqa: B018 - private names are not server methods
    code = ("import pickle, sys; h = pickle.loads(sys.stdin.buffer.read()); "
            "print(h.worker_name, h.namespace, h.server_name, callable(h.generate.remote), "
            "'torch' in sys.modules, 'ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(handle), capture_output=True, check=True)
    assert done.stdout.decode().split() == ["abc123WorkerDict_0:0", "job-namespace", "hf_server_0_0", "True",
                                            "False", "False"]
