"""End to end: ``python -m agentevolver.rollout`` with a real model against the real environment service.

The built-in ``tiny-test`` model generates (through the CPU generator) on ``codebox`` and ``calc`` tasks served
by ``env_service.py``; the test reads the rollout dump the command wrote and checks every record.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from env_service_fixture import REPO_ROOT, env_service
from transformers import AutoTokenizer

from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import TERMINATIONS, read_rollout_dump


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc,codebox", tmp_path=tmp_path_factory.mktemp("rollout_cli")) as running:
        yield running.url


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "agentevolver.rollout", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True)


COMMON = ["actor_rollout_ref.model.path=tiny-test", "data.max_prompt_length=3072",
          "actor_rollout_ref.rollout.response_length=256", "agent_flow.max_tokens_per_turn=24",
          "agent_flow.max_steps=3"]


@pytest.mark.parametrize(("env_type", "split"), [("calc", "val"), ("codebox", "val")])
def test_rollout_cli_writes_a_valid_dump(service: str, tmp_path: Path, env_type: str, split: str) -> None:
    done = run_cli("--split", split, "--num-tasks", "2", "--n", "2", "--run-dir", str(tmp_path), "--step", "5",
                   "--seed", "0", f"env_service.env_url={service}", f"env_service.env_type={env_type}", *COMMON)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "success rate" in done.stdout and "ended by" in done.stdout
    dump = tmp_path / "rollouts" / "step_5.jsonl"
    assert f"rollout dump: {dump}" in done.stdout.replace("\n", "")
    records = list(read_rollout_dump(dump))
    assert len(records) == 4
    assert len({r["group_id"] for r in records}) == 2 and sorted(r["rollout_id"] for r in records) == [0, 0, 1, 1]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    for record in records:
        assert record["env_type"] == env_type and record["step"] == 5
        assert record["termination"] in TERMINATIONS and record["termination"] not in ("error", "env_error")
        assert 1 <= record["num_turns"] <= 3
        n = len(record["response_ids"])
        assert n == len(record["response_mask"]) == len(record["step_ids"]) == len(record["response_logprobs"])
        assert sum(record["response_mask"]) == record["metrics"]["episode/generated_tokens"]
        for mask, step, logprob in zip(record["response_mask"], record["step_ids"], record["response_logprobs"],
                                       strict=True):
            assert (mask == 1) == (step >= 0)
            assert logprob <= 0.0 and (mask == 1 or logprob == 0.0)
        text = tokenizer.decode(record["prompt_ids"] + record["response_ids"])
        assert text.startswith("<|im_start|>system\n")
        generated = [m for m in record["messages"] if m["author"] == "llm"]
        assert len(generated) == record["num_turns"]
        assert record["reward"]["outcome"] in (0.0, 1.0, -1.0)
    assert httpx.get(f"{service}/stats").json()["data"]["live_instances"] == 0


def test_rollout_cli_bad_input_is_a_clear_error(service: str, tmp_path: Path) -> None:
    done = run_cli("--split", "nope", "--run-dir", str(tmp_path), f"env_service.env_url={service}",
                   "env_service.env_type=calc", *COMMON)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "split" in (done.stdout + done.stderr)
    bad = run_cli("--run-dir", str(tmp_path), "agent_flow.context_template=spiral", *COMMON)
    assert bad.returncode == 2 and "agent_flow.context_template" in bad.stdout
