"""verl's own PPO trainer on CPU through the agentevolver verl plugin (config preset ``backend/cpu``).

The end-to-end test runs verl's legacy trainer exactly as ``verl.trainer.main_ppo`` does
(``run_ppo(config, main_ppo_v0.TaskRunner)``: ray.init from ``ray_kwargs``, TaskRunner actor,
``RayPPOTrainer.init_workers`` + ``fit``) for 2 GRPO steps: ``tiny-test`` model, rollout ``hf``
(``rollout.n=2``), verl's ``single_turn_agent`` loop, a 4-prompt parquet dataset and a custom reward file.

How the weight sync is proven (rollout server == actor):

* The custom reward function runs in verl's reward-loop worker *while* each step's rollout is generated,
  i.e. after the weight sync that preceded it and before the next one. Besides scoring, it asks the
  rollout server actor (``hf_server_0_0``) for its weights and step number and saves them once per step:
  ``server_step<k>.pt`` = what the server generated with after the sync of step ``k``.
* ``trainer.save_freq=1`` with ``save_contents=[hf_model]`` makes the trainer save the actor's full weights
  after each update, right before it syncs them to the server.
* So: ``server_step0`` must equal the original model file (initial sync), ``server_step1`` must equal the
  actor checkpoint of step 1 *exactly* (same fp32 bits), and it must differ from ``server_step0`` (the sync
  moved real, changed weights). The step-2 log-probs of the rollout and the actor agree too (verl's own
  ``rollout_corr/log_ppl_abs_diff`` metric), which checks the same thing functionally.

The remaining checks read verl's metrics from its file logger (``VERL_FILE_LOGGER_PATH``): two steps,
finite actor loss, finite and positive grad norm; and the step-2 checkpoint differs from the original model.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from training_fixture import FP32, load_safetensors, training_timeout  # noqa: E402

pytest.importorskip("verl")

SERVER_ACTOR = "hf_server_0_0"  # agentevolver.verl.cpu.rollout.server_actor_name(0)

REWARD_SOURCE = f'''
"""Test reward: a deterministic pseudo-random score of the text, and a dump of the rollout server's weights.

GRPO needs different rewards within a group for a non-zero gradient; a checksum of the characters makes
two different samples score differently almost surely (length parity would tie half the time).
"""
import os


async def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    dump_dir = os.environ.get("AE_TEST_SERVER_DUMP")
    if dump_dir:
        import ray
        import torch

        server = ray.get_actor("{SERVER_ACTOR}")
        status = await server.status.remote()
        path = os.path.join(dump_dir, f"server_step{{status['global_steps']}}.pt")
        if not os.path.exists(path):
            state = await server.state_dict.remote()
            torch.save({{"status": status, "state": state}}, path + f".{{os.getpid()}}.tmp")
            os.replace(path + f".{{os.getpid()}}.tmp", path)
    return (sum(ord(c) for c in solution_str) % 97) / 97.0
'''


@pytest.fixture(autouse=True)
def _no_external_plugin_policy(monkeypatch: pytest.MonkeyPatch):
    """The plugin must be discovered by verl's default policy ("auto")."""
    if os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto") not in ("", "auto"):
        pytest.skip("VERL_USE_EXTERNAL_PLUGINS disables entry-point plugins in this environment")


def _compose_cpu(overrides: list[str]):
    """The root config with the cpu preset (the root's default ``backend: cpu``, named explicitly), its ``auto``
    dtypes, threads and OpenMP wait policy resolved as ``agentevolver.main_ppo`` resolves them before verl reads
    them."""
    from agentevolver.backends.cpu.precision import resolve_auto_dtypes
    from agentevolver.backends.cpu.threads import resolve_auto_threads, resolve_wait_policy
    from agentevolver.config import compose_config

    config = compose_config(["backend=cpu", *overrides])
    resolve_auto_dtypes(config)
    resolve_auto_threads(config)
    resolve_wait_policy(config)
    return config


def _write_dataset(path: Path) -> None:
    import pandas as pd

    questions = ["Name a colour.", "Count to three.", "Say hello.", "What is two plus two?"]
    rows = [
        {
            "data_source": "cpu_backend_test",
            "prompt": [{"role": "user", "content": question}],
            "ability": "test",
            "reward_model": {"style": "rule", "ground_truth": "unused"},
            "extra_info": {"index": index, "split": "train"},
        }
        for index, question in enumerate(questions)
    ]
    pd.DataFrame(rows).to_parquet(path)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], names: list[str]) -> float:
    return max((a[n].float() - b[n].float()).abs().max().item() for n in names)


def test_plugin_registrations_in_this_process():
    """What the plugin registers during ``import verl`` (the same code runs in every Ray worker)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.plugin.platform import PlatformRegistry
    from verl.utils.device import get_device_name, get_torch_device
    from verl.workers.engine import EngineRegistry
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.rollout.replica import get_rollout_replica_class

    from agentevolver.verl import patches
    from agentevolver.verl.cpu.platform import PlatformCPU, torch_is_cpu_only
    from agentevolver.verl.cpu.rollout import HFReplica, HFServerAdapter

    assert PlatformRegistry.get("cpu") is PlatformCPU
    assert get_rollout_replica_class("hf") is HFReplica
    assert get_rollout_class("hf", "async") is HFServerAdapter
    assert "agentevolver" in _agent_loop_registry
    if not torch_is_cpu_only():
        pytest.skip("a CUDA build of torch: the cpu platform is only chosen with VERL_PLATFORM=cpu")
    assert get_device_name() == "cpu"
    device = get_torch_device()
    for name in ("empty_cache", "synchronize", "memory_allocated", "mem_get_info", "get_device_name",
                 "current_device", "manual_seed", "get_rng_state", "set_rng_state", "is_available"):
        assert callable(getattr(device, name)), name
    assert device.current_device() == "cpu"
    assert patches.is_applied()
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__ == "SharedPromptFSDPEngine"


def test_device_module_has_every_attribute_verl_calls():
    """Every ``get_torch_device().<name>`` in the installed verl exists on the cpu platform's device module."""
    import re

    import verl

    from agentevolver.verl.cpu.platform import device_module

    pattern = re.compile(r"get_torch_device\(\)\.(\w+)")
    used = set()
    for file in Path(verl.__file__).parent.rglob("*.py"):
        used.update(pattern.findall(file.read_text(encoding="utf-8", errors="replace")))
    assert "empty_cache" in used  # the scan itself works
    missing = sorted(name for name in used if not hasattr(device_module, name))
    assert not missing, f"verl calls get_torch_device().{missing} that the cpu device module lacks"


def test_when_imported_runs_after_the_import_and_survives_find_spec_probes(tmp_path: Path, monkeypatch):
    import importlib.util
    import sys

    from agentevolver.verl.plugin import when_imported

    (tmp_path / "ae_hook_probe.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("ae_hook_probe", lambda module: seen.append(module.VALUE + 1))
    assert importlib.util.find_spec("ae_hook_probe") is not None and seen == []  # a probe is no import
    try:
        import ae_hook_probe  # noqa: F401

        assert seen == [42]
        when_imported("ae_hook_probe", lambda module: seen.append("again"))  # already imported: runs now
        assert seen == [42, "again"]
    finally:
        sys.modules.pop("ae_hook_probe", None)


def test_patch_guard_rejects_a_changed_function():
    """The guard refuses to patch a function that does not look like verl 0.9.1's."""
    from agentevolver.verl.patches import VerlChangedError, _check

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return backend or "gloo"

    with pytest.raises(VerlChangedError, match="no longer builds"):
        _check(initialize_global_process_group_ray)

    def other_signature(timeout_second=None):
        return None

    with pytest.raises(VerlChangedError, match="now takes"):
        _check(other_signature)


def _rollout_config(**overrides: str):
    """The composed config with the cpu preset and the tiny-test model, resolved as verl's TaskRunner does."""
    from omegaconf import OmegaConf

    from agentevolver.models import resolve_model_path

    config = _compose_cpu(
        [
            f"actor_rollout_ref.model.path={resolve_model_path('tiny-test')}",
            "data.max_prompt_length=128",
            "data.max_response_length=32",
            *(f"{key}={value}" for key, value in overrides.items()),
        ]
    )
    OmegaConf.resolve(config)  # as verl's TaskRunner does before anything reads it
    return config


def _server(**overrides: str):
    """An HFRolloutServer built directly (no Ray) from the composed config with the cpu preset."""
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.verl.cpu.rollout import HFRolloutServer

    config = _rollout_config(**overrides)
    return HFRolloutServer(
        config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, RolloutMode.HYBRID, replica_rank=0
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
async def test_adapter_sends_full_weights_in_the_servers_dtype(dtype: str):
    """The actor's fp32 master weights reach a bf16 server as bf16 (half the bytes) and load exactly as the
    server's own rounding would; an fp32 server gets them unchanged."""
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.verl.cpu.rollout import HFRolloutServer, HFServerAdapter
    from agentevolver.verl.cpu.rollout_server import InProcessServer

    config = _rollout_config(**{"actor_rollout_ref.rollout.dtype": dtype})
    rollout, model = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model
    server = HFRolloutServer(rollout, model, RolloutMode.HYBRID, replica_rank=0)
    await server.ready()
    arrived: list[torch.dtype] = []
    load_weights = server.load_weights

    async def recording_load(weights):
        arrived.extend(tensor.dtype for _, tensor in weights)
        return await load_weights(weights)

    server.load_weights = recording_load
    adapter = HFServerAdapter(rollout, model, replica_rank=0)
    adapter._server = InProcessServer(server)  # called as its actor: handle.method.remote(...)
    params = dict(server._generator.model.named_parameters())
    torch.manual_seed(0)
    sent = {name: param.detach().float() + 1e-3 * torch.randn(param.shape) for name, param in params.items()}
    await adapter.update_weights(iter(sent.items()), global_steps=1)
    assert set(arrived) == {getattr(torch, dtype)} and len(arrived) == len(sent)
    for name, param in params.items():
        assert torch.equal(param.detach(), sent[name].to(param.dtype)), name


async def test_server_generates_like_verls_vllm_server():
    server = _server()
    info = await server.ready()
    # the preset's rollout.dtype is auto: bf16 where it is faster on this CPU, else fp32
    from agentevolver.backends.cpu.precision import resolve_dtype

    assert info["dtype"] == ("torch.bfloat16" if resolve_dtype("auto") == "bf16" else "torch.float32")
    await server.set_global_steps(3)
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    out = await server.generate(prompt_ids=[1, 42, 7], sampling_params=dict(params), request_id="a")
    assert 1 <= len(out.token_ids) <= 32 and len(out.log_probs) == len(out.token_ids)
    assert out.stop_reason == "completed"  # EOS and length stops both report "completed", as vLLM's
    assert out.extra_fields["global_steps"] == 3
    # vLLM's budget rule: min(response_length, prompt_length + response_length - prompt), clamped to >= 1
    assert server._max_tokens(10, {}) == 32
    assert server._max_tokens(150, {}) == 10
    assert server._max_tokens(159, {}) == 1
    assert server._max_tokens(10, {"max_tokens": 5}) == 5
    long = await server.generate(
        prompt_ids=[1, 42], sampling_params={**params, "max_tokens": 40, "ignore_eos": True}, request_id="b"
    )
    assert len(long.token_ids) == 40


async def test_server_abort_parks_or_rejects_until_resume():
    import asyncio

    server = _server()
    params = {"temperature": 1.0, "max_tokens": 3000, "ignore_eos": True}
    running = asyncio.create_task(server.generate(prompt_ids=[1, 5], sampling_params=params, request_id="r"))
    await asyncio.sleep(0.5)
    result = await server.abort_all_requests()
    assert result["request_ids"] == ["r"]
    aborted = await running
    assert aborted.stop_reason == "aborted" and len(aborted.token_ids) < 3000
    parked = asyncio.create_task(server.generate(prompt_ids=[1, 5], sampling_params={"max_tokens": 2}, request_id="p"))
    await asyncio.sleep(0.2)
    assert not parked.done()  # held until resume_generation
    await server.resume_generation()
    assert len((await parked).token_ids) >= 1
    await server.abort_all_requests(reject_request=True)
    rejected = await server.generate(prompt_ids=[1, 5], sampling_params={"max_tokens": 2}, request_id="x")
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    await server.resume_generation()


async def test_server_weight_sync_must_cover_every_parameter():
    server = _server()
    state = await server.state_dict()
    names = [name for name in state if name != "lm_head.weight"]
    changed = {name: tensor + 0.5 for name, tensor in state.items()}
    await server.begin_weight_update()
    await server.load_weights([(name, changed[name]) for name in names[:3]])
    with pytest.raises(RuntimeError, match=r"left \d+ parameter"):
        await server.finish_weight_update(global_steps=1)
    await server.begin_weight_update()
    await server.load_weights([(name, changed[name]) for name in names])
    assert await server.finish_weight_update(global_steps=1) == len(names)
    assert (await server.status())["global_steps"] == 1
    after = await server.state_dict()
    assert all(torch.equal(after[name], changed[name]) for name in names)


@training_timeout
def test_legacy_trainer_runs_grpo_on_cpu(tmp_path: Path):
    import ray
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.main_ppo_v0 import TaskRunner

    from agentevolver.models import resolve_model_path
    from agentevolver.verl.cpu.platform import torch_is_cpu_only

    if not torch_is_cpu_only():
        pytest.skip("CPU backend test: needs the CPU build of torch")
    if ray.is_initialized():
        ray.shutdown()

    model_dir = Path(resolve_model_path("tiny-test"))
    data = tmp_path / "train.parquet"
    _write_dataset(data)
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(REWARD_SOURCE)
    dump_dir = tmp_path / "server"
    dump_dir.mkdir()
    checkpoints = tmp_path / "checkpoints"
    metrics_file = tmp_path / "metrics.jsonl"

    config = _compose_cpu(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={data}",
            f"data.val_files={data}",
            "data.train_batch_size=2",
            "data.max_prompt_length=128",
            "data.max_response_length=32",
            "data.dataloader_num_workers=0",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            # fp32 throughout (the preset's auto is bf16 on a CPU with bf16 units): the weight sync is checked
            # exactly below; tests/test_main_ppo.py checks the bf16 gap
            *FP32,
            "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            # verl's own agent loop leaves scoring to the reward-loop workers, which the cpu preset leaves out
            # (our agent loop scores every episode itself)
            "reward.num_workers=1",
            f"reward.custom_reward_function.path={reward_file}",
            "reward.custom_reward_function.name=compute_score",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=1",
            "trainer.resume_mode=disable",
            f"trainer.default_local_dir={checkpoints}",
            "trainer.logger=[console,file]",
            "trainer.experiment_name=cpu_backend_test",
            "+ray_kwargs.ray_init.include_dashboard=false",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics_file}",
            f"+ray_kwargs.ray_init.runtime_env.env_vars.AE_TEST_SERVER_DUMP={dump_dir}",
        ]
    )

    started = time.monotonic()
    try:
        run_ppo(config, task_runner_class=TaskRunner)
    finally:
        ray.shutdown()
    print(f"2 GRPO steps on CPU, Ray start to finish: {time.monotonic() - started:.1f} s")

    # -- both steps ran, loss and gradients are sane (verl's own metrics, from its file logger) ------------
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    steps = {record["step"]: record["data"] for record in records}
    assert sorted(steps) == [1, 2], f"logged steps: {sorted(steps)}"
    for step, metrics in steps.items():
        loss = metrics["actor/pg_loss"]
        grad_norm = metrics["actor/grad_norm"]
        assert math.isfinite(loss), (step, loss)
        assert math.isfinite(grad_norm) and grad_norm > 0, (step, grad_norm)
        assert metrics["response_length/mean"] > 0, step
    # Step 2 generated with the weights synced after step 1: rollout and actor log-probs agree.
    assert steps[2]["rollout_corr/log_ppl_abs_diff"] < 1e-4, steps[2]["rollout_corr/log_ppl_abs_diff"]

    # -- the actor's weights moved ----------------------------------------------------------------------------
    original = load_safetensors(model_dir)
    names = sorted(original)
    ckpt = {step: load_safetensors(checkpoints / f"global_step_{step}" / "actor" / "huggingface") for step in (1, 2)}
    for step in (1, 2):
        assert set(names) <= set(ckpt[step]), sorted(set(names) - set(ckpt[step]))
    assert _max_diff(ckpt[1], original, names) > 1e-5
    assert _max_diff(ckpt[2], ckpt[1], names) > 1e-5

    # -- after each sync the rollout server held exactly the actor's weights ---------------------------------
    dumps = {int(p.stem.removeprefix("server_step")): torch.load(p) for p in dump_dir.glob("server_step*.pt")}
    assert sorted(dumps) == [0, 1], f"server dumps for steps {sorted(dumps)}"
    server = {step: dump["state"] for step, dump in dumps.items()}
    for step in (0, 1):
        assert set(names) <= set(server[step]), sorted(set(names) - set(server[step]))
    expected = {0: original, 1: ckpt[1]}
    for step in (0, 1):
        unequal = [n for n in names if not torch.equal(server[step][n], expected[step][n].to(server[step][n].dtype))]
        assert not unequal, f"server weights after sync {step} differ from the actor's: {unequal[:5]}"
    assert _max_diff(server[1], server[0], names) > 1e-5  # the second sync really changed the served model
    assert dumps[1]["status"]["stats"]["requests"] > 0
