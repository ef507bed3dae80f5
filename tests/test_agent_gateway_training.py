"""An agent written with the OpenAI SDK trains through ``main_ppo`` via the gateway.

examples/agent_program/calc_agent.py, unchanged, is the agent of every episode: 2 GRPO steps of tiny-test on
the ``lottery`` environment (its score varies between samples whatever the model says, so the update has
advantages to follow; groups of 4, since with 2 tasks x 2 samples over 2 steps every group tied about one run
in 16 and the update then had nothing to follow), through the real training entry with Ray, verl's agent-loop workers, the CPU rollout
server and the gateway served inside the agent-loop worker. The dumps must obey the invariants agent-flow
episodes obey.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import REPO_ROOT, env_service
from training_fixture import run_training, training_command, training_timeout

from agentevolver.module.agent_flow import read_rollout_dump
from agentevolver.verl.tracking import read_metrics

pytestmark = training_timeout

AGENT = REPO_ROOT / "examples" / "agent_program" / "calc_agent.py"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("lottery", tmp_path=tmp_path_factory.mktemp("gateway_training")) as running:
        yield running.url


def check_token_fields(fields: dict) -> None:
    """The invariants of one dumped sample (as tests/test_agent_flow.py checks agent-flow samples)."""
    n = len(fields["response_ids"])
    assert len(fields["response_mask"]) == len(fields["step_ids"]) == len(fields["response_logprobs"]) == n
    for mask, step, logprob in zip(fields["response_mask"], fields["step_ids"], fields["response_logprobs"],
                                   strict=True):
        assert (mask == 1) == (step >= 0)
        if mask == 0:
            assert logprob == 0.0
    steps = [s for s in fields["step_ids"] if s >= 0]
    assert steps == sorted(steps)


def test_an_openai_sdk_agent_trains_two_grpo_steps_through_the_gateway(service: str, tmp_path: Path) -> None:
    done = run_training(training_command(
        service, tmp_path, f"agent_program.callable={AGENT}:run", "agent_program.reward=env",
        "agent_program.timeout_s=600", "agent_flow.max_steps=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"), tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
        assert metrics["episode/count"] == 8 and metrics["episode/failed"] == 0.0
        assert metrics["episode/failed/program"] == 0.0
    calls = 0
    mixed_groups = 0
    for step in (1, 2):
        records = list(read_rollout_dump(tmp_path / "run" / "rollouts" / f"step_{step}.jsonl"))
        assert len(records) == 8 and len({r["group_id"] for r in records}) == 2
        scores: dict[str, set[float]] = {}
        for record in records:
            scores.setdefault(record["group_id"], set()).add(record["reward"]["outcome"])
        mixed = sum(len(group) > 1 for group in scores.values())
        # GRPO: a group whose samples all scored alike has zero advantage, so the gradient is non-zero exactly
        # when some group is mixed
        assert (steps[step]["actor/grad_norm"] > 0) == (mixed > 0), (step, scores, steps[step]["actor/grad_norm"])
        mixed_groups += mixed
        for record in records:
            assert record["failure"] is None and record["env_type"] == "lottery"
            assert record["termination"] in ("finished", "max_steps", "budget"), record["error"]
            check_token_fields(record)
            for other in record["other_samples"]:
                check_token_fields(other)
            assert len(record["advantages"]) == len(record["response_ids"])
            assert record["metrics"]["episode/calls"] == record["num_turns"] >= 1
            calls += record["num_turns"]
            # the dump shows the program's conversation: its opening came from the environment's messages
            assert record["messages"][0]["role"] == "system" and "chain" in record["messages"][0]
    assert calls >= 16
    assert mixed_groups > 0  # the update had something to follow (all 4 groups of 4 tie with p ~ 1/4096)


GALLERY = REPO_ROOT / "examples" / "agent_program"


def test_the_agents_sdk_gallery_agent_trains_a_grpo_step_unchanged(service: str, tmp_path: Path) -> None:
    """The OpenAI Agents SDK with its defaults (the Responses API), as the gallery has it: a command program
    (its own process, reading OPENAI_BASE_URL), where the calc agent above is a callable. One step: the weight
    sync between steps is the calc agent's run's to prove. The gallery's LangGraph agent is a callable like the
    calc agent, so its training would prove nothing that run does not; tests/test_gateway_gallery.py runs it
    (and this one) against the gateway and calc."""
    done = run_training(training_command(
        service, tmp_path, f"agent_program.command=[{sys.executable},{GALLERY / 'agents_sdk_agent.py'}]",
        "agent_program.reward=env", "agent_program.timeout_s=600", "agent_flow.max_steps=4",
        "trainer.total_training_steps=1", "trainer.save_freq=-1"), tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1]
    metrics = steps[1]
    assert math.isfinite(metrics["actor/pg_loss"]) and math.isfinite(metrics["actor/grad_norm"])
    assert metrics["episode/count"] == 4 and metrics["episode/failed"] == 0.0, metrics
    records = list(read_rollout_dump(tmp_path / "run" / "rollouts" / "step_1.jsonl"))
    assert len(records) == 4
    for record in records:
        assert record["failure"] is None and record["num_turns"] >= 1, record["error"]
        check_token_fields(record)


def test_a_step_whose_programs_all_fail_stops_with_its_dump_written_and_an_error_quoted(service: str,
                                                                                      tmp_path: Path) -> None:
    """Every episode's program raises: the run stops at step 1 (exit 2), its message quotes the program's error
    and how many episodes share it, and the step's dump, written before the stop, holds every episode's error."""
    program = tmp_path / "broken_agent.py"
    program.write_text("def run(task):\n    raise RuntimeError('the agent cannot reach its tools')\n")
    done = run_training(training_command(service, tmp_path, f"agent_program.callable={program}:run",
                                         "agent_program.reward=env"), tmp_path)
    assert done.returncode == 2, (done.stdout + done.stderr)[-6000:]
    message = done.stderr[done.stderr.index("error: "):]
    assert "training step 1: every episode failed" in message and "x program: check the agent program" in message
    assert ("The most common error (4 of the 4 failed episodes): program: \"the program raised RuntimeError: the "
            "agent cannot reach its tools\"") in message, message
    dump = tmp_path / "run" / "rollouts" / "step_1.jsonl"
    assert f"rollout dump, {dump}" in message
    records = list(read_rollout_dump(dump))
    assert len(records) == 4 and all(r["failure"] == "program" and "cannot reach" in r["error"] for r in records)
    assert not (tmp_path / "run" / "global_step_1").exists()
