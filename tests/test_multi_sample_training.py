"""End to end: multi-sample context managers train every sample (``python -m agentevolver.main_ppo``).

``linear_think`` (one sample per turn once the think hint moves) and ``self_clip`` (a new sample after each
archive, the archivist played by the scripted OpenAI-compatible server) on ``lottery_turns``, a three-step
test environment, scored by a checksum of the response so every group has advantages, with the ``tiny-test``
model, for one step. Checked: the rows verl trained on are exactly the samples in the rollout dumps (final +
earlier, plus fully masked padding to whole mini-batches), the earlier samples' policy tokens carry their
episode's non-zero advantage, and an earlier sample's log-probs changed after the update.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from env_service_fixture import env_service
from scripted_openai_server import SCRIPTED_MODEL
from training_fixture import checksum_reward, run_training, training_command, training_env, training_timeout

from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout

#: Three turns of up to 16 tokens fit one sample's response; prompts grow with the stripped history. One step,
#: groups of 4 scored by a checksum of the response (a custom reward): lottery_turns' own 0/1 score ties a whole
#: group 1 time in 8, and then the step has no advantage to check.
BUDGET = ("data.max_response_length=160", "actor_rollout_ref.rollout.response_length=160",
          "agent_flow.max_steps=3", "env_service.env_type=lottery_turns", "trainer.save_freq=1",
          "trainer.total_training_steps=1", "actor_rollout_ref.rollout.n=4")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery_turns", tmp_path=tmp_path_factory.mktemp("multi_sample")) as running:
        yield running.url


def _train(service: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [arg for arg in training_command(service, run_dir, *BUDGET, *checksum_reward(run_dir), *extra)
               if arg != "env_service.env_type=lottery"]
    return run_training(command, run_dir)


def _sequence_logprobs(model_dir: Path, prompt: list[int], response: list[int], mask: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1]
    logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    return logprobs[torch.tensor(mask, dtype=torch.bool)]


def _check_every_sample_trained(run: Path) -> None:
    steps = read_metrics(run / "metrics.jsonl")
    assert sorted(steps) == [1]
    earlier_total = 0
    for step, metrics in steps.items():
        records = list(read_rollout_dump(run / "rollouts" / f"step_{step}.jsonl"))
        earlier = sum(len(r["other_samples"]) for r in records)
        earlier_total += earlier
        assert metrics["train/episode_rows"] == len(records) == 8
        assert metrics["train/earlier_sample_rows"] == earlier
        assert metrics["train/rows"] - metrics["train/pad_rows"] == len(records) + earlier
        assert metrics["train/rows"] % 8 == 0  # whole mini-batches (ppo_mini_batch_size 2 x n 4)
        if earlier:
            assert metrics["train/earlier_sample_policy_tokens"] > 0
        for name in ("timing_s/judge", "timing_s/dump", "timing_s/sample_rows", "timing_s/update_actor"):
            assert name in metrics
    assert earlier_total > 0, "no episode produced more than one sample"
    assert steps[1].get("train/earlier_sample_adv_abs_mean", 0.0) > 0, "no earlier sample got an advantage"

    # an earlier sample: its log-probs after the step's update differ from those before it (tiny-test's own)
    record = next(r for r in read_rollout_dump(run / "rollouts" / "step_1.jsonl") if r["other_samples"])
    sample = record["other_samples"][0]
    tokens = (sample["prompt_ids"], sample["response_ids"], sample["response_mask"])
    before = _sequence_logprobs(Path(resolve_model_path("tiny-test")), *tokens)
    after = _sequence_logprobs(run / "global_step_1" / "actor" / "huggingface", *tokens)
    assert before.numel() > 0 and (after - before).abs().max() > 1e-6


def test_linear_think_trains_every_turns_sample(service: str, tmp_path: Path) -> None:
    done = _train(service, tmp_path, "agent_flow.context_template=linear_think")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    _check_every_sample_trained(tmp_path / "run")


def test_self_clip_trains_the_samples_before_each_archive(service: str, tmp_path: Path, scripted_llm) -> None:
    scripted_llm.respond_with(lambda body: "- the agent answered twice")
    done = _train(service, tmp_path, "agent_flow.context_template=self_clip", "agent_flow.context.clip_threshold=0.3",
                  f"llm.endpoints.local.base_url={scripted_llm.base_url}",
                  f"llm.endpoints.local.model={SCRIPTED_MODEL}", "llm.endpoints.local.backoff_initial_s=0")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert scripted_llm.requests, "the archivist was never asked: no context was clipped"
    _check_every_sample_trained(tmp_path / "run")


def test_a_combination_that_cannot_train_every_sample_stops_on_the_driver(tmp_path: Path) -> None:
    """GAE gives per-token advantages, which earlier samples cannot inherit: exit 2 before Ray starts."""
    done = subprocess.run([sys.executable, "-m", "agentevolver.main_ppo", "--config-name", "quickstart",
                           "actor_rollout_ref.model.path=tiny-test", "agent_flow.context_template=self_clip",
                           "algorithm.adv_estimator=gae", "critic.enable=false"],
                          cwd=tmp_path, env=training_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "outcome-level estimator" in done.stderr and "algorithm.adv_estimator='gae'" in done.stderr
    assert not (tmp_path / "checkpoints").exists()  # nothing written for a run that never started
