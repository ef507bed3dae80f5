"""The command line of a small training run (tiny-test, 2 tasks x 2 episodes per step) for trainer tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


def training_command(service: str, run_dir: Path, *extra: str) -> list[str]:
    """``python -m agentevolver.main_ppo --config-name quickstart`` shrunk for tests: the run folder is
    ``run_dir/run`` (checkpoints every step, ``rollouts/``, ``metrics.jsonl``), the step table on stdout."""
    return [
        sys.executable, "-m", "agentevolver.main_ppo",
        "--config-name", "quickstart",
        "actor_rollout_ref.model.path=tiny-test",
        "trainer.total_training_steps=2",
        f"env_service.env_url={service}", "env_service.env_type=lottery", "env_service.create_params={}",
        "env_service.train_split=train", "env_service.val_split=val",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "data.max_prompt_length=256",
        "data.max_response_length=64", "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-4", "agent_flow.max_tokens_per_turn=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.rollout_correction.bypass_mode=false",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=1",
        f"trainer.default_local_dir={run_dir / 'run'}", "trainer.logger=[table,jsonl]",
        "+ray_kwargs.ray_init.include_dashboard=false",
        *extra,
    ]


def load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files of a checkpoint folder (a model file or a saved HF dir)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    assert state, f"no safetensors in {folder}"
    return state


def training_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
