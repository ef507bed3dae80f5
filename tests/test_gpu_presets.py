"""The presets in examples/ on GPU machines, checked without a GPU.

Every preset is composed with ``backend=gpu`` and put through what verl 0.9.1 does with a config before any
worker starts (``validate_config`` as the TaskRunner calls it, and the dataclasses the workers build from
their sections), so a missing size or a key verl refuses fails here, not on a GPU node after Ray started.
Then: the 7B presets carry the reference's numbers and read the model path from ``MODEL_PATH``; the
launcher's ``--dry-run`` prints each preset's plan; ``scripts/gpu_check.sh --report`` judges a run folder;
and, on a machine with a GPU (the ``gpu`` marker), the whole GPU check runs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict
from training_fixture import REPO_ROOT, training_timeout

from agentevolver.config import load_config
from agentevolver.launcher.cli import main as launcher_main
from agentevolver.models import resolve_model_path
from agentevolver.verl.async_loop import check_async

EXAMPLES = REPO_ROOT / "examples"
PRESETS = sorted(path.stem for path in EXAMPLES.glob("*.yaml"))
GPU_PRESETS = ["appworld_qwen25_7b", "bfcl_qwen25_7b", "gpu_smoke"]
SEVEN_B = ["appworld_qwen25_7b", "bfcl_qwen25_7b"]


def verl_startup_checks(cfg: DictConfig) -> None:
    """What verl does with the config before workers exist: the TaskRunner's ``validate_config`` and the
    dataclasses the actor/rollout/ref workers and the trainer build (the model section with a local model,
    since the preset's model is not on this machine)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = copy.deepcopy(cfg)
    OmegaConf.resolve(cfg)
    if OmegaConf.select(cfg, "actor_rollout_ref.model.lora_rank", default=0) and find_spec("vllm") is None:
        # verl checks a LoRA rank against vLLM's by importing its vLLM rollout, which needs vLLM (not installed
        # here): with merged weights it skips that one check. tests/test_lora_vllm.py runs LoRA on vLLM.
        with open_dict(cfg):
            cfg.actor_rollout_ref.model.lora.merge = True
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
    omega_conf_to_dataclass(cfg.algorithm)
    if need_reference_policy(cfg):  # as ActorRolloutRefWorker.init_model turns the ref section into a config
        ref = cfg.actor_rollout_ref.ref
        with open_dict(ref):
            ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
            ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
            ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
            ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
            ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
        omega_conf_to_dataclass(ref)
    model = copy.deepcopy(cfg.actor_rollout_ref.model)
    with open_dict(model):
        model.path = str(resolve_model_path("tiny-test"))
    omega_conf_to_dataclass(model)


@pytest.fixture(scope="module")
def composed() -> dict[str, DictConfig]:
    """Every preset composed with backend=gpu, once (composition imports verl's config tree)."""
    return {name: load_config(["backend=gpu"], config_name=name)[0] for name in PRESETS}


def test_presets_present() -> None:
    assert {"quickstart", "basic", "overall", *GPU_PRESETS} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_passes_verls_validation_on_gpu(composed: dict[str, DictConfig], name: str) -> None:
    cfg = composed[name]
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.name, cfg.trainer.device) == ("vllm", "cuda")
    # the sdpa fallback: no flash-attn in the gpu set, so neither its kernel nor its varlen packing
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.model.use_remove_padding is False
    # one sharding path on both backends: FSDP2, the reference model following the actor
    assert cfg.actor_rollout_ref.actor.strategy == cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    # no reward-loop process on a GPU either: our agent loop scores every episode (a reward model needs them)
    assert cfg.reward.num_workers == 0 or cfg.reward.reward_model.enable
    verl_startup_checks(cfg)
    check_async(cfg)  # an async preset keeps its rollout's memory through the update on a GPU too


def test_gpu_backend_supplies_every_size_verl_requires() -> None:
    """The root config (no sizes of its own) with backend=gpu would stop in validate_config without them."""
    cfg, _ = load_config(["backend=gpu"])
    verl_startup_checks(cfg)
    for key in ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"):
        assert OmegaConf.select(cfg, key) == 1, key
    broken = copy.deepcopy(cfg)
    broken.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = None
    with pytest.raises(ValueError, match="log_prob_micro_batch_size"):
        verl_startup_checks(broken)


@pytest.mark.parametrize("name", SEVEN_B)
def test_7b_presets_carry_the_references_numbers(composed: dict[str, DictConfig], name: str) -> None:
    cfg = composed[name]
    aro = cfg.actor_rollout_ref
    window = cfg.data.max_prompt_length + aro.rollout.response_length
    assert window == aro.rollout.max_model_len == aro.actor.ppo_max_token_len_per_gpu == 25580
    assert (cfg.data.max_prompt_length, aro.rollout.response_length, cfg.agent_flow.max_tokens_per_turn) == (
        4000, 21580, 4096)
    assert (cfg.data.train_batch_size, aro.rollout.n, aro.actor.ppo_mini_batch_size) == (32, 8, 8)
    assert (aro.actor.optim.lr, aro.actor.kl_loss_coef, aro.actor.kl_loss_type) == (1e-6, 0.001, "low_var_kl")
    assert aro.actor.use_kl_loss and aro.rollout.temperature == 0.9 and aro.rollout.val_kwargs.n == 8
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == (8, 1)
    assert aro.rollout.tensor_model_parallel_size == 1 and aro.ref.fsdp_config.param_offload
    # all three mechanisms on (the headline row)
    assert cfg.task_manager.n == 8 and not cfg.task_manager.mixture.use_original_tasks
    assert cfg.exp_manager.train_rollout_mode == "mixed" and cfg.memory.enable_context_generator
    assert aro.actor.policy_loss.loss_mode == "exp_on_off"
    assert cfg.algorithm.adv_estimator == "adca_grpo"  # ADCA's one switch
    assert cfg.attribution_driven_credit_assignment.adca_grpo.alpha == 0.2
    assert cfg.env_service.env_type == {"appworld_qwen25_7b": "appworld", "bfcl_qwen25_7b": "bfcl"}[name]


def test_preset_model_paths_are_never_hard_coded() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        node = raw.get("actor_rollout_ref", {}).get("model", {})
        value = node.get("path")
        if value is None:
            continue  # inherited
        assert not str(value).startswith(("/", "~")), f"{path.name}: hard-coded model path {value!r}"
        if path.stem in GPU_PRESETS:
            assert str(value).startswith("${oc.env:MODEL_PATH,"), path.name


def test_service_urls_and_model_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_PATH", "/shared/models/Qwen2.5-7B-Instruct")
    monkeypatch.setenv("AGENTEVOLVER_ENV_URL", "http://10.1.2.3:8080")
    monkeypatch.setenv("AGENTEVOLVER_MEMORY_URL", "http://10.1.2.3:8001")
    monkeypatch.setenv("AGENTEVOLVER_LLM_BASE_URL", "http://10.1.2.4:8000/v1")
    monkeypatch.setenv("AGENTEVOLVER_LLM_MODEL", "judge-model")
    cfg, settings = load_config([], config_name="bfcl_qwen25_7b")
    assert cfg.actor_rollout_ref.model.path == "/shared/models/Qwen2.5-7B-Instruct"
    assert settings.env_service.env_url == "http://10.1.2.3:8080"
    assert str(cfg.memory.base_url) == "http://10.1.2.3:8001"
    assert (cfg.llm.endpoints.local.base_url, cfg.llm.endpoints.local.model) == ("http://10.1.2.4:8000/v1",
                                                                               "judge-model")
    monkeypatch.delenv("MODEL_PATH")
    cfg, _ = load_config([], config_name="appworld_qwen25_7b")
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-7B-Instruct"  # a hub id, read from the offline cache


SERVICES = {"quickstart": ["--with-env"], "basic": ["--with-env"], "agent_program": ["--with-env"]}


@pytest.mark.parametrize("name", PRESETS)
def test_launcher_dry_run_shows_the_plan(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps the plan's grid at the terminal width (80 under pytest)
    flags = SERVICES.get(name, ["--with-env", "--with-memory", "--with-llm"])
    rc = launcher_main(["--conf", str(EXAMPLES / f"{name}.yaml"), *flags, "--dry-run", "--",
                        f"launcher.record_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "launch plan for experiment" in out and "--dry-run: nothing started" in out
    assert "--config-name config" in out
    for service in ("env", *(["memory", "llm"] if len(flags) > 1 else [])):
        assert f"service {service}" in out


# ------------------------------------------------------------------------------------------ the GPU check


def _run_folder(tmp_path: Path, **overrides: Any) -> Path:
    """A finished gpu_smoke run folder as the report reads it (metrics of 2 steps, checkpoint, task files)."""
    run = tmp_path / "run"
    (run / "global_step_2" / "actor").mkdir(parents=True)
    (run / "synthetic_tasks").mkdir()
    (run / "synthetic_tasks" / "calc.checkpoint.json").write_text(json.dumps({"explorations": [{}, {}, {}, {}]}))
    (run / "synthetic_tasks" / "calc.jsonl").write_text('{"task": 1}\n')
    step = {"actor/pg_loss": 0.01, "actor/grad_norm": 1.5, "episode/count": 16, "episode/success_rate": 0.3,
            "exp/summary_submitted": 16, "adca/judge/requests": 16, "training/rollout_probs_diff_mean": 0.004,
            "training/rollout_probs_diff_max": 0.2, "training/rollout_actor_probs_pearson_corr": 0.99,
            "rollout_corr/log_ppl_abs_diff": 0.01, "rollout_corr/kl": 0.001, "timing_s/step": 30.0}
    lines = [{"step": 1, **step, "exp/init_episodes": 8}, {"step": 2, **step, **overrides}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def _report(run: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTEVOLVER_GPU_CHECK_DIR": str(tmp_path / "check")}
    return subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--report", str(run)],
                          env=env, capture_output=True, text=True, timeout=120)


def test_gpu_check_report_passes_a_good_run(tmp_path: Path) -> None:
    done = _report(_run_folder(tmp_path), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "GPU check: PASS"
    assert "ok   Self-Questioning: 4 exploration(s), 1 synthetic task(s) kept" in done.stdout
    report = json.loads((tmp_path / "check" / "report.json").read_text())
    assert report["pass"] and len(report["checks"]) == 8


def test_gpu_check_report_fails_on_a_log_prob_gap(tmp_path: Path) -> None:
    done = _report(_run_folder(tmp_path, **{"training/rollout_probs_diff_mean": 0.2}), tmp_path)
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == "GPU check: FAIL (rollout vs trainer log-probs)"


def test_gpu_check_report_fails_without_a_run(tmp_path: Path) -> None:
    done = _report(tmp_path / "missing", tmp_path)
    assert done.returncode == 1 and "FAIL training steps" in done.stdout


@pytest.mark.gpu
@training_timeout
def test_gpu_check_script(tmp_path: Path) -> None:
    """The whole check on a GPU machine: install (if needed), 2 GRPO steps with vLLM + FSDP, report."""
    env = {**os.environ, "AGENTEVOLVER_GPU_CHECK_DIR": str(tmp_path)}
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    assert done.stdout.splitlines()[-1] == "GPU check: PASS"
