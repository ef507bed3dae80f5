"""Actor LoRA with the ``hf`` rollout (issue 45, part 2): the server's adapter merge, the start-up checks, and 2 GRPO
steps through ``python -m agentevolver.main_ppo`` with an adapter-only checkpoint and a resume from it.

The training test runs tiny-test with verl's FSDP LoRA (``actor_rollout_ref.model.lora_rank=8``, all linear layers)
in fp32, the trainer recomputing the old log-probs (so verl logs the rollout-vs-trainer gap of every step), and a
custom reward that also saves the rollout server's weights once per sync (it runs in the agent-loop worker, while
the step's episodes are generated):

* run 1 (2 steps) syncs **adapters** (``model.lora.merge=false``, verl's default): step 0's base sync, then only the
  adapters, which the server merges (``agentevolver.verl.cpu.lora.AdapterMerger``). After sync 1 the served
  targets moved and everything else is the original model; the rollout's log-probs equal the trainer's (LoRA
  unmerged) within 1e-4. Checkpoints are adapter-only (``save_lora_only=true``): every key is a LoRA tensor.
* run 2 resumes from run 1's step-1 checkpoint and syncs **merged weights** (``model.lora.merge=true``): its first
  sync serves run 1's sync-1 weights as verl rounds them (bf16), so the adapters came back from the adapter-only
  checkpoint; it trains step 2 on the tasks run 1's step 2 had.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import env_service
from training_fixture import (
    FP32,
    dumped_tasks,
    load_safetensors,
    resume_from,
    run_training,
    training_command,
    training_timeout,
)

from agentevolver.errors import ConfigError
from agentevolver.verl.tracking import read_metrics

torch = pytest.importorskip("torch")

#: verl's FSDP LoRA: rank, alpha and targets (peft's all-linear: every linear layer but the output head).
LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear")
SERVER_ACTOR = "hf_server_0_0"  # agentevolver.verl.cpu.rollout.server_actor_name(0)

REWARD_SOURCE = f'''
"""Test reward: a checksum of the text (samples of a group score differently), and the rollout server's weights
saved once per sync (the server reports the step of the weights it holds)."""
import os


async def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    import torch

    from agentevolver.verl.cpu.rollout_server import server_handle

    dump_dir = os.environ["AE_TEST_SERVER_DUMP"]
    server = server_handle("{SERVER_ACTOR}")  # an actor, or hosted in the training worker
    status = await server.status.remote()
    path = os.path.join(dump_dir, f"server_step{{status['global_steps']}}.pt")
    if not os.path.exists(path):
        state = await server.state_dict.remote()
        torch.save(state, path + f".{{os.getpid()}}.tmp")
        os.replace(path + f".{{os.getpid()}}.tmp", path)
    return (sum(ord(c) for c in solution_str) % 97) / 97.0
'''


def _tiny_path() -> str:
    from agentevolver.models import resolve_model_path

    return str(resolve_model_path("tiny-test"))


# ------------------------------------------------------------------------------------------ the server's merge


def _server() -> Any:
    """An fp32 HFRolloutServer over tiny-test, built directly (no Ray) from the composed config."""
    from omegaconf import OmegaConf
    from verl.workers.rollout.replica import RolloutMode

    from agentevolver.config import compose_config
    from agentevolver.verl.cpu.rollout import HFRolloutServer

    config = compose_config([f"actor_rollout_ref.model.path={_tiny_path()}", "actor_rollout_ref.rollout.dtype=fp32",
                             "data.max_prompt_length=64", "data.max_response_length=16"])
    OmegaConf.resolve(config)
    return HFRolloutServer(config.actor_rollout_ref.rollout, config.actor_rollout_ref.model, RolloutMode.HYBRID,
                           replica_rank=0)


def _peft_model(seed: int, **lora: Any) -> Any:
    """tiny-test under peft's LoRA with random B (peft starts B at zero, which would merge to nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(_tiny_path(), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False, **lora)
    return get_peft_model(model, config)


def _adapters(peft_model: Any) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """What verl's adapter sync sends: peft's adapter state dict and the config as a dict."""
    from peft.utils.save_and_load import get_peft_model_state_dict

    state = get_peft_model_state_dict(peft_model)
    return [(name, tensor.detach().clone()) for name, tensor in state.items()], \
        peft_model.peft_config["default"].to_dict()


async def _sync_adapters(server: Any, adapters: list[tuple[str, Any]], peft_config: dict[str, Any], step: int) -> int:
    """An adapter sync in two buckets, B halves first (a target is merged once both halves are in)."""
    ordered = sorted(adapters, key=lambda item: ".lora_A." in item[0])
    await server.begin_weight_update("adapters")
    half = len(ordered) // 2
    await server.load_lora_adapter(ordered[:half], peft_config)
    await server.load_lora_adapter(ordered[half:], peft_config)
    return await server.finish_weight_update(global_steps=step)


async def test_the_server_merges_adapters_as_peft_does_and_serves_the_lora_model() -> None:
    server = _server()
    ids = torch.tensor([[1, 42, 7, 99, 5]])
    for step, seed in ((1, 0), (2, 1)):  # a second sync replaces the first adapter, it does not add to it
        peft_model = _peft_model(seed).eval()
        adapters, peft_config = _adapters(peft_model)
        with torch.no_grad():
            expected_logits = peft_model(input_ids=ids).logits  # LoRA unmerged, as the trainer computes
        written = await _sync_adapters(server, adapters, peft_config, step)
        assert written == len(adapters) // 2  # one weight per target
        served = await server.state_dict()
        merged = peft_model.merge_and_unload().state_dict()
        assert set(merged) <= set(served)
        worst = max((served[name] - merged[name]).abs().max().item() for name in merged)
        assert worst < 1e-6, worst  # peft's own merge, in fp32
        with torch.no_grad():
            logits = server._model(input_ids=ids).logits
        assert (logits - expected_logits).abs().max().item() < 1e-4
        assert (await server.status())["global_steps"] == step


async def test_a_base_sync_sets_the_base_adapters_merge_onto() -> None:
    """verl's first adapter-route sync sends the base model with ``.base_layer`` names for the LoRA targets."""
    server = _server()
    original = await server.state_dict()
    peft_model = _peft_model(0)
    adapters, peft_config = _adapters(peft_model)
    target = "model.layers.0.self_attn.q_proj.weight"
    base = {name: tensor + (0.25 if name == target else 0.0) for name, tensor in original.items()
            if name != "lm_head.weight"}  # tied to the embeddings
    targets = {name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
               for name, _ in adapters if ".lora_A." in name}
    await server.begin_weight_update()
    await server.load_weights([(name.replace(".weight", ".base_layer.weight") if name in targets else name, tensor)
                               for name, tensor in base.items()])
    await server.finish_weight_update(global_steps=0)
    await _sync_adapters(server, adapters, peft_config, 1)
    served = await server.state_dict()
    lora_a = dict(adapters)[f"base_model.model.{target.removesuffix('.weight')}.lora_A.weight"]
    lora_b = dict(adapters)[f"base_model.model.{target.removesuffix('.weight')}.lora_B.weight"]
    expected = base[target] + (lora_b @ lora_a) * (8 / 4)
    assert (served[target] - expected).abs().max().item() < 1e-6


async def test_a_hosted_servers_base_sync_keeps_no_storage_of_the_trainers() -> None:
    """Hosted in the training worker (``trainer.rollout_server=worker``), the adapter hands the server the trainer's
    own tensors: nothing copies them on the way, as Ray's transfer did. The server keeps LoRA base weights to merge
    every later adapter sync onto, so what it keeps must be its own copy (the merger's base snapshot, the model's
    parameters): a trainer tensor changed after the sync (FSDP reuses its gathered storage) must not move it."""
    from agentevolver.verl.cpu.rollout import HFServerAdapter
    from agentevolver.verl.cpu.rollout_server import InProcessServer, _hosted, host, server_actor_name

    server = _server()
    name = server_actor_name(0)
    host(name, server)
    try:
        adapter = HFServerAdapter(server.config, server.model_config, replica_rank=0)
        peft_model = _peft_model(0)
        adapters, peft_config = _adapters(peft_model)
        trainer_base = {name: tensor.detach() for name, tensor in peft_model.base_model.model.state_dict().items()
                        if "lora_" not in name and name != "lm_head.weight"}  # the peft model's own storage
        await adapter.update_weights(iter(trainer_base.items()), global_steps=0, peft_config=peft_config,
                                     base_sync_done=False)
        assert isinstance(adapter.server, InProcessServer)  # the adapter found the server in this process
        target = "model.layers.0.self_attn.q_proj.weight"
        base_before = trainer_base[target.replace(".weight", ".base_layer.weight")].clone()
        with torch.no_grad():
            for tensor in trainer_base.values():
                tensor.add_(1.0)  # the trainer's storage changes after the sync
        await adapter.update_weights(iter(adapters), global_steps=1, peft_config=peft_config, base_sync_done=True)
        served = await server.state_dict()
        lora_a = dict(adapters)[f"base_model.model.{target.removesuffix('.weight')}.lora_A.weight"]
        lora_b = dict(adapters)[f"base_model.model.{target.removesuffix('.weight')}.lora_B.weight"]
        assert (served[target] - (base_before + (lora_b @ lora_a) * (8 / 4))).abs().max().item() < 1e-6
    finally:
        _hosted.pop(name, None)


async def test_an_adapter_sync_must_pair_its_halves_and_keep_its_targets() -> None:
    server = _server()
    adapters, peft_config = _adapters(_peft_model(0))
    await server.begin_weight_update("adapters")
    await server.load_lora_adapter([item for item in adapters if ".lora_A." in item[0]], peft_config)
    with pytest.raises(RuntimeError, match="unpaired LoRA half"):
        await server.finish_weight_update(global_steps=1)
    await _sync_adapters(server, adapters, peft_config, 1)
    first_target = next(name for name, _ in adapters).rsplit(".lora_", 1)[0]
    with pytest.raises(RuntimeError, match="left out 1 LoRA target"):
        await _sync_adapters(server, [item for item in adapters if not item[0].startswith(first_target + ".")],
                             peft_config, 2)


async def test_adapters_the_server_cannot_merge_are_refused_naming_the_fix() -> None:
    server = _server()
    adapters, peft_config = _adapters(_peft_model(0, use_dora=True))
    await server.begin_weight_update("adapters")
    with pytest.raises(ValueError, match=r"DoRA.*lora\.merge=true"):
        await server.load_lora_adapter(adapters, peft_config)


# ------------------------------------------------------------------------------------------ start-up checks


@pytest.mark.parametrize(("overrides", "message"), [
    (["actor_rollout_ref.model.lora.rank=8"], r"lora\.rank=8 is Megatron's LoRA key.*lora_rank=8"),
    ([*LORA, "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"], r"hf_model.*save_lora_only"),
    ([*LORA, "+actor_rollout_ref.model.target_parameters=[experts.gate_up_proj]"], r"target_parameters.*merge=true"),
    ([*LORA, "actor_rollout_ref.rollout.layered_summon=true"], r"layered_summon.*load_format=auto"),
])
def test_lora_settings_verl_cannot_run_stop_at_start(overrides: list[str], message: str) -> None:
    from agentevolver.config import compose_config
    from agentevolver.verl.cpu.lora import check_lora

    with pytest.raises(ConfigError, match=message):
        check_lora(compose_config(overrides))
    check_lora(compose_config(list(LORA)))  # the plain LoRA settings pass


# ------------------------------------------------------------------------------------------ training


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("lora")) as running:
        yield running.url


def lora_command(service: str, run_dir: Path, *extra: str) -> list[str]:
    """The trainer tests' tiny-test run with LoRA on every linear layer, fp32, adapter-only checkpoints, and the
    reward file that saves the server's weights (``run_dir/server``)."""
    (run_dir / "server").mkdir(exist_ok=True)
    (run_dir / "reward.py").write_text(REWARD_SOURCE)
    command = training_command(
        service, run_dir, *LORA, *FP32,
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        "actor_rollout_ref.actor.checkpoint.save_lora_only=true",
        f"reward.custom_reward_function.path={run_dir / 'reward.py'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.AE_TEST_SERVER_DUMP={run_dir / 'server'}",
        *extra,
    )
    # LoRA's usual step size, 100x the trainer tests' full fine-tuning one: one step moves the merged weights by
    # more than bf16 rounding, so the merged route's sync can be told from the base model
    return [arg.replace("optim.lr=1e-4", "optim.lr=1e-2") for arg in command]


def server_dumps(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem.removeprefix("server_step")): torch.load(p) for p in (run_dir / "server").glob("server_step*.pt")}



@training_timeout
def test_lora_trains_two_steps_on_the_hf_rollout_and_resumes_from_an_adapter_only_checkpoint(
        service: str, tmp_path: Path) -> None:
    first = tmp_path / "first"
    first.mkdir()
    done = run_training(lora_command(service, first), first)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]

    steps = read_metrics(first / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2], sorted(steps)
    for step, metrics in steps.items():
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0, (step, metrics)
        # the server merged the adapters (fp32) and serves what the trainer computes with LoRA unmerged
        assert metrics["rollout_corr/log_ppl_abs_diff"] < 1e-4, (step, metrics["rollout_corr/log_ppl_abs_diff"])

    original = load_safetensors(Path(_tiny_path()))
    served = server_dumps(first)
    assert sorted(served) == [0, 1], sorted(served)
    targets = sorted(n for n in original if n.endswith("_proj.weight"))
    assert targets and all(torch.equal(served[0][n], original[n]) for n in original)  # sync 0: B = 0, the base
    moved = [n for n in targets if not torch.equal(served[1][n], original[n])]
    assert moved == targets  # every LoRA target moved after step 1 ...
    assert all(torch.equal(served[1][n], original[n]) for n in original if n not in targets)  # ... nothing else

    for step in (1, 2):  # adapter-only checkpoints: every tensor of the model file is a LoRA tensor
        actor = first / "run" / f"global_step_{step}" / "actor"
        model_file = actor / "model_world_size_1_rank_0.pt"
        keys = list(torch.load(model_file, weights_only=False))
        assert keys and all("lora_" in key for key in keys), keys[:5]
        assert model_file.stat().st_size < (Path(_tiny_path()) / "model.safetensors").stat().st_size / 10
        assert (actor / "lora_train_meta.json").is_file()

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    done = run_training(lora_command(service, resumed, *resume_from(first, 1),
                                     "actor_rollout_ref.model.lora.merge=true"), resumed)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    steps = read_metrics(resumed / "run" / "metrics.jsonl")
    assert sorted(steps) == [2], sorted(steps)
    assert steps[2]["actor/grad_norm"] > 0
    assert dumped_tasks(resumed, 2) == dumped_tasks(first, 2)

    again = server_dumps(resumed)
    assert sorted(again) == [1], sorted(again)  # one sync: the checkpoint's adapters, merged by verl
    for name in targets:
        after, before = again[1][name], served[1][name]
        assert torch.equal(after, after.to(torch.bfloat16).float())  # verl's merged route sends bf16
        assert ((after - before).abs() <= before.abs() * 2**-8 + 1e-12).all(), name  # = run 1's sync 1, rounded
    rounded_base = [n for n in targets if torch.equal(again[1][n], original[n].to(torch.bfloat16).float())]
    assert not rounded_base, rounded_base  # the adapters came back: not the base model
    gaps = [read_metrics(first / "run" / "metrics.jsonl")[s]["rollout_corr/log_ppl_abs_diff"] for s in (1, 2)]
    print(f"rollout vs trainer log-ppl gap: adapters {gaps[0]:.2e} / {gaps[1]:.2e} (steps 1 / 2), merged (bf16) "
          f"after the resume {steps[2]['rollout_corr/log_ppl_abs_diff']:.2e}")
