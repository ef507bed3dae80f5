"""The ADCA step judge and the trainer's ADCA stage.

The judge is played by the scripted OpenAI-compatible server (real HTTP through the real client); the
stage runs on a verl ``DataProto`` built from real episodes (the real agent flow against the real
environment service, with a scripted policy) and verl's own GRPO advantages.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from env_service_fixture import env_service
from scripted_openai_server import SCRIPTED_API_KEY_ENV, Reply, ScriptedOpenAIServer
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.workers.rollout.replica import TokenOutput

from agentevolver.client.env_client import EnvClient, EnvClientSettings
from agentevolver.client.llm_client import LLMClient
from agentevolver.config import compose_config, validate_config
from agentevolver.errors import ConfigError
from agentevolver.models import resolve_model_path
from agentevolver.module.adv_processor import (
    AdcaHyper,
    AdcaStage,
    JudgeInput,
    JudgeParseError,
    StepFlagsResult,
    Transcript,
    compute_prm_grpo_advantages,
    evaluate_step_flags,
    parse_step_judgments,
    transcript_from_record,
)
from agentevolver.module.adv_processor.judge_prompt import StepText, clip_text
from agentevolver.module.adv_processor.stage import judge_inputs
from agentevolver.module.agent_flow import AgentFlow, AgentFlowConfig, EpisodeSpec
from agentevolver.module.tools import ToolRegistry
from agentevolver.verl.agent_loop import to_agent_loop_output

GOOD, BAD = True, False


# ----------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize(("reply", "expected"), [
    ("Step 1 Judgment: GOOD\nStep 2 Judgment: BAD\nStep 3 Judgment: good", [GOOD, BAD, GOOD]),
    ("Step 2 Judgment: BAD\nStep 1 Judgment: GOOD\nStep 3 Judgment: BAD", [GOOD, BAD, BAD]),  # by number
    ("**Step 1 Judgment:** GOOD - found it\n**Step 2 Judgment:** BAD\n- Step 3: GOOD", [GOOD, BAD, GOOD]),
    ("Step 0 Judgment: BAD\nStep 1 Judgment: GOOD\nStep 2 Judgment: GOOD", [BAD, GOOD, GOOD]),  # 0-based
    ("<think>Step 1 Judgment: BAD? no</think>Step 1 Judgment: GOOD\nStep 2 Judgment: GOOD\n"
     "Step 3 Judgment: BAD", [GOOD, GOOD, BAD]),
    # numbering unusable (a step judged twice, contradictory) -> the judgments in order
    ("Step 1 Judgment: GOOD\nStep 1 Judgment: BAD\nStep 3 Judgment: BAD", [GOOD, BAD, BAD]),
    # no numbering at all -> the 'Judgment:' labels in order
    ("Judgment: BAD\nJudgment: BAD\nJudgment: GOOD", [BAD, BAD, GOOD]),
    # no format at all -> upper-case labels in order (prose 'good' is not a label)
    ("Looks good overall.\nGOOD\nBAD\nGOOD", [GOOD, BAD, GOOD]),
])
def test_parse_numbered_first_then_ordered(reply: str, expected: list[bool]) -> None:
    assert parse_step_judgments(reply, 3) == expected


@pytest.mark.parametrize("reply", [
    "I cannot judge this.",
    "Step 1 Judgment: GOOD\nStep 2 Judgment: BAD",  # two of three
    "Step 1 Judgment: GOOD\nStep 2 Judgment: BAD\nStep 3 Judgment: GOOD\nStep 4 Judgment: GOOD",  # four of three
    "",
])
def test_unreadable_replies_raise(reply: str) -> None:
    with pytest.raises(JudgeParseError, match="3 step"):
        parse_step_judgments(reply, 3)


def test_clip_keeps_head_and_tail() -> None:
    text = "HEAD" + "x" * 5000 + "TAIL"
    clipped = clip_text(text, 300)
    assert clipped.startswith("HEAD") and clipped.endswith("TAIL") and "characters cut" in clipped
    assert len(clipped) <= 300 and clip_text("short", 300) == "short"


def test_transcript_from_a_dump_record() -> None:
    record = {"messages": [
        {"role": "system", "content": "rules", "author": "system", "step": -1},
        {"role": "user", "content": "add 2 and 3", "author": "env", "step": -1},
        {"role": "user", "content": "past experience", "author": "experience", "step": -1},
        {"role": "assistant", "content": "", "author": "llm", "step": 0,
         "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
        {"role": "tool", "content": "5", "author": "env", "step": 0},
        {"role": "assistant", "content": "FINAL 5", "author": "llm", "step": 1},
    ]}
    transcript = transcript_from_record(record, 2, 500)
    assert transcript is not None and transcript.task == "add 2 and 3"
    assert transcript.steps[0] == StepText('[tool call] add({"a": 2})', "5")
    assert transcript.steps[1] == StepText("FINAL 5", "(nothing)")
    assert transcript_from_record({"messages": []}, 2, 500) is None


# ----------------------------------------------------------------------------------------- the judge over HTTP
def transcript(steps: int) -> Transcript:
    return Transcript(task="say bye", steps=tuple(StepText(f"action {j}", f"obs {j}") for j in range(steps)))


def item(steps: int, outcome: float = 1.0, advantage: float = 0.5, *, text: bool = True) -> JudgeInput:
    return JudgeInput(num_steps=steps, outcome=outcome, grpo_advantage=advantage, success=outcome > 0,
                      transcript=transcript(steps) if text else None)


def steps_in(body: dict[str, Any]) -> int:
    return int(re.search(r"## Steps \((\d+)\)", body["messages"][-1]["content"]).group(1))


def labels(body: dict[str, Any]) -> str:
    """A well-behaved judge: GOOD for step 1, BAD for the rest."""
    return "\n".join(f"Step {n} Judgment: {'GOOD' if n == 1 else 'BAD'}" for n in range(1, steps_in(body) + 1))


@pytest.fixture
def judge(scripted_llm: ScriptedOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv(SCRIPTED_API_KEY_ENV, "sk-test")
    clients: list[LLMClient] = []

    def make(**endpoint: Any) -> LLMClient:
        clients.append(LLMClient(scripted_llm.endpoint(**endpoint), name="scripted"))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


async def test_one_request_per_non_skipped_sample_with_all_its_steps(scripted_llm: ScriptedOpenAIServer,
                                                                     judge: Any) -> None:
    scripted_llm.respond_with(labels)
    inputs = [item(3), item(2, advantage=0.0), item(0), item(4, outcome=0.0, advantage=-0.5),
              item(1, outcome=0.0, advantage=0.0), item(2, text=False)]
    result = await evaluate_step_flags(inputs, judge(), skip_type="skip_small_adv", small_adv_threshold=1e-6)
    assert result.status == ["judged", "skipped", "no_steps", "judged", "skipped", "no_transcript"]
    assert result.flags == [[GOOD, BAD, BAD], [GOOD, GOOD], [], [GOOD, BAD, BAD, BAD], [BAD], None]
    bodies = scripted_llm.bodies
    assert sorted(steps_in(b) for b in bodies) == [3, 4]  # exactly one request per judged sample
    prompt = next(b for b in bodies if steps_in(b) == 4)["messages"][-1]["content"]
    assert all(f"### Step {n}\nAgent:\naction {n - 1}\nEnvironment:\nobs {n - 1}" in prompt for n in range(1, 5))
    assert "The episode FAILED (reward 0)" in prompt
    metrics = result.metrics()
    assert (metrics["adca/judge/requests"], metrics["adca/judge/skipped"], metrics["adca/judge/fallback"]) == (2, 2, 1)
    assert metrics["adca/judge/fallback_rate"] == pytest.approx(1 / 5)


async def test_skip_all_neg_judges_only_successes(scripted_llm: ScriptedOpenAIServer, judge: Any) -> None:
    scripted_llm.respond_with(labels)
    result = await evaluate_step_flags([item(2, 1.0), item(2, 0.0), item(3, -1.0)], judge(), skip_type="skip_all_neg")
    assert result.status == ["judged", "skipped", "skipped"] and len(scripted_llm.requests) == 1
    assert result.flags[1:] == [[BAD, BAD], [BAD, BAD, BAD]]


@pytest.mark.parametrize(("limit", "at_most"), [(2, 2), (4, 4)])
async def test_requests_in_flight_are_capped_by_the_endpoint(scripted_llm: ScriptedOpenAIServer, judge: Any,
                                                             limit: int, at_most: int) -> None:
    # every reply is held until `limit` requests are in flight (or 5 s): proves both the cap and concurrency
    scripted_llm.respond_with(lambda body: Reply.answer(labels(body), hold_until_in_flight=limit, delay_s=5.0))
    result = await evaluate_step_flags([item(2) for _ in range(8)], judge(max_concurrency=limit))
    assert result.status == ["judged"] * 8 and scripted_llm.max_in_flight == at_most


async def test_garbage_is_asked_again_then_falls_back(scripted_llm: ScriptedOpenAIServer, judge: Any) -> None:
    scripted_llm.plan("I refuse.", "Step 1 Judgment: BAD\nStep 2 Judgment: GOOD")
    result = await evaluate_step_flags([item(2)], judge(), parse_retries=1)
    assert result.flags == [[BAD, GOOD]] and result.parse_retries == 1 and len(scripted_llm.requests) == 2

    scripted_llm.reset()
    scripted_llm.respond_with(lambda body: "GOOD")  # one label for two steps, every time
    result = await evaluate_step_flags([item(2), item(2)], judge(), parse_retries=2)
    assert result.flags == [None, None] and result.status == ["unparseable"] * 2
    assert len(scripted_llm.requests) == 6 and result.metrics()["adca/judge/unparseable"] == 2
    assert "unreadable reply" in result.errors[0]


async def test_a_judge_that_times_out_or_fails_falls_back_without_raising(scripted_llm: ScriptedOpenAIServer,
                                                                         judge: Any) -> None:
    scripted_llm.respond_with(lambda body: Reply.hang(3.0))
    result = await evaluate_step_flags([item(2)], judge(timeout_s=0.3, max_retries=1))
    assert result.status == ["judge_error"] and result.flags == [None] and len(scripted_llm.requests) == 2
    assert "no reply within timeout_s=0.3 s" in result.errors[0]

    scripted_llm.reset()
    scripted_llm.respond_with(lambda body: Reply.error(503))
    result = await evaluate_step_flags([item(1), item(2)], judge(max_retries=1))
    assert result.status == ["judge_error"] * 2 and result.metrics()["adca/judge/errors"] == 2
    scripted_llm.reset()
    scripted_llm.respond_with(lambda body: Reply.raw("{not json"))
    result = await evaluate_step_flags([item(1)], judge(max_retries=0))
    assert result.status == ["judge_error"]


# ----------------------------------------------------------------------------------------- the stage
@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))


class ScriptedPolicy:
    """The policy at the edge: each call answers the next scripted text as tokens (verl's TokenOutput)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        ids = [*tokenizer().encode(self.replies.pop(0), add_special_tokens=False), tokenizer().eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("echo", tmp_path=tmp_path_factory.mktemp("adca")) as running:
        yield running.url


#: (group, scripted replies): echo ends the episode (reward 1) on "bye"; max_steps=3 ends it with 0.
EPISODES = [("g0", ["hello", "bye"]), ("g0", ["hi", "what", "nope"]), ("g0", ["bye"]),
            ("g1", ["x", "y", "z"]), ("g1", ["a", "b", "c"])]


async def real_batch(service: str) -> DataProto:
    """A DataProto shaped like the trainer's after rewards and GRPO, from real episodes."""
    outputs = []
    async with EnvClient(EnvClientSettings(env_url=service)) as env:
        for rollout, (group, replies) in enumerate(EPISODES):
            flow = AgentFlow(AgentFlowConfig.model_validate({"max_steps": 3}), tokenizer=tokenizer(), env_client=env,
                             generate=ScriptedPolicy(replies).generate, max_model_len=2048,
                             tool_registry=ToolRegistry())
            result = await flow.run(EpisodeSpec(task_id="t0", env_type="echo", group_id=group, rollout_id=rollout),
                                    {"temperature": 1.0})
            outputs.append(to_agent_loop_output(result, tokenizer()))
    length = max(len(o.response_ids) for o in outputs)
    mask = torch.zeros(len(outputs), length, dtype=torch.long)
    rewards = torch.zeros(len(outputs), length)
    for i, output in enumerate(outputs):
        mask[i, : len(output.response_mask)] = torch.tensor(output.response_mask)
        rewards[i, len(output.response_ids) - 1] = output.reward_score
    uid = np.array([group for group, _ in EPISODES], dtype=object)
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask.float(), uid)
    non_tensors = {"uid": uid}
    for key in ("step_ids", "episode_record"):
        column = np.empty(len(outputs), dtype=object)
        column[:] = [o.extra_fields[key] for o in outputs]
        non_tensors[key] = column
    return DataProto.from_dict(
        tensors={"responses": torch.zeros_like(mask), "response_mask": mask, "token_level_rewards": rewards,
                 "token_level_scores": rewards.clone(), "advantages": advantages, "returns": returns},
        non_tensors=non_tensors)


def stage_config(scripted_llm: ScriptedOpenAIServer, *extra: str) -> Any:
    return compose_config([
        "attribution_driven_credit_assignment.enable=true",
        f"llm.endpoints.local.base_url={scripted_llm.base_url}",
        "llm.endpoints.local.backoff_initial_s=0", "llm.endpoints.local.backoff_max_s=0",
        "llm.endpoints.local.max_retries=0",
        "attribution_driven_credit_assignment.adca_grpo.alpha=0.5", *extra])


def adca_stage(config: Any, total_training_steps: int, **kwargs: Any) -> AdcaStage:
    """The stage as the trainer builds it: with the run's settings, validated once by the entry point."""
    return AdcaStage(config, total_training_steps, settings=validate_config(config), **kwargs)


async def test_stage_rewrites_the_advantages_of_a_real_batch(service: str, scripted_llm: ScriptedOpenAIServer,
                                                             tmp_path: Path) -> None:
    batch = await real_batch(service)
    grpo = batch.batch["advantages"].clone()
    # the judge answers every sample but the one whose task text it cannot read (garbage -> GRPO fallback)
    answers = iter(["garbage"] + [None] * 10)

    def responder(body: dict[str, Any]) -> str:
        planned = next(answers)
        return planned if planned is not None else labels(body)

    scripted_llm.respond_with(responder)
    stage = adca_stage(stage_config(scripted_llm, "attribution_driven_credit_assignment.judge.parse_retries=0"),
                      total_training_steps=10)
    metrics = stage.apply(batch, step=1)
    stage.close()

    assert len(scripted_llm.requests) == 5  # one per sample (none skipped by default)
    flags = list(batch.non_tensor_batch["step_flags"])
    assert sum(f is None for f in flags) == 1 and metrics["adca/judge/fallback"] == 1
    steps = [max(ids) + 1 for ids in batch.non_tensor_batch["step_ids"]]
    assert steps == [2, 3, 1, 3, 3]
    assert all(f is None or f == [GOOD] + [BAD] * (k - 1) for f, k in zip(flags, steps, strict=True))
    fallback = flags.index(None)
    assert torch.equal(batch.batch["advantages"][fallback], grpo[fallback])
    # the rest is exactly compute_prm_grpo_advantages with those labels and alpha 0.5
    expected = compute_prm_grpo_advantages(batch, flags, AdcaHyper(alpha=0.5)).advantages
    assert torch.equal(batch.batch["advantages"], expected) and torch.equal(batch.batch["returns"], expected)
    assert not torch.equal(batch.batch["advantages"], grpo)
    # tokens the policy did not generate carry nothing
    assert bool((batch.batch["advantages"][batch.batch["response_mask"] == 0] == 0).all())
    assert metrics["adca/active"] == 1.0 and metrics["adca/alpha"] == 0.5
    for key in ("adca/outcome_share_last_mean", "adca/alpha_effective", "adca/sum_step_reward_sign_agree"):
        assert 0.0 <= metrics[key] < 10.0
    # the labels survive verl's conversion for the actor update
    assert "step_flags" in batch.to_tensordict()


async def test_the_judge_stage_runs_before_any_advantage_and_reads_the_same_grpo(
        service: str, scripted_llm: ScriptedOpenAIServer) -> None:
    """The trainer's order: ``label`` on the rollout's batch (scores only, no advantages yet), then the
    advantage stage. The judge sees the GRPO advantage it would have read from the batch, so skip rules
    decide alike."""
    batch = await real_batch(service)
    with_adv = adca_stage(stage_config(scripted_llm), 10)
    expected = [item.grpo_advantage for item in judge_inputs(batch, 2000)]
    for key in ("advantages", "returns", "token_level_rewards"):
        batch.batch.pop(key)
    seen = [item.grpo_advantage for item in judge_inputs(batch, 2000)]
    assert seen == pytest.approx(expected, abs=1e-5)
    scripted_llm.respond_with(labels)
    stage = adca_stage(stage_config(scripted_llm, "algorithm.adv_estimator=adca_grpo"), 10)
    found = stage.label(batch, step=1)
    assert found is not None and len(found.flags) == len(batch) and found.metrics["adca/judge/judged"] == 5
    with_adv.close()
    stage.close()


async def test_stage_outside_prm_steps_or_disabled_calls_no_judge(service: str,
                                                                  scripted_llm: ScriptedOpenAIServer) -> None:
    batch = await real_batch(service)
    grpo = batch.batch["advantages"].clone()
    stage = adca_stage(stage_config(scripted_llm, "attribution_driven_credit_assignment.adca_grpo.prm_steps=2"), 10)
    assert stage.apply(batch, step=3) == {"adca/active": 0.0}
    off = adca_stage(compose_config([f"llm.endpoints.local.base_url={scripted_llm.base_url}"]), 10)
    assert off.apply(batch, step=1) == {}
    assert torch.equal(batch.batch["advantages"], grpo) and not scripted_llm.requests
    assert "step_flags" not in batch.non_tensor_batch


def test_stage_alpha_decays_along_the_configured_schedule(scripted_llm: ScriptedOpenAIServer) -> None:
    decay = ["attribution_driven_credit_assignment.adca_grpo.alpha_cosine_decay_enable=true",
             "attribution_driven_credit_assignment.adca_grpo.alpha_min=0.1"]
    stage = adca_stage(stage_config(scripted_llm, *decay), total_training_steps=5)
    assert [round(stage.alpha(s), 6) for s in (1, 6, 9)] == [0.5, 0.1, 0.1]
    fixed = adca_stage(stage_config(scripted_llm, *decay, "attribution_driven_credit_assignment.adca_grpo.total_steps=9"),
                      total_training_steps=5)
    assert fixed.alpha(6) > 0.1


def test_stage_rejects_a_non_grpo_estimator(scripted_llm: ScriptedOpenAIServer) -> None:
    with pytest.raises(ConfigError, match=r"set algorithm\.adv_estimator=adca_grpo"):
        adca_stage(stage_config(scripted_llm, "algorithm.adv_estimator=gae"), 10)
    with pytest.raises(ConfigError, match="allocation_inconsistent_weight"):
        adca_stage(stage_config(scripted_llm, "attribution_driven_credit_assignment.adca_grpo."
                               "allocation_inconsistent_weight=0"), 10)


def test_step_flags_result_metrics_when_nothing_needed_judging() -> None:
    empty = StepFlagsResult(flags=[[]], status=["no_steps"])
    assert empty.metrics()["adca/judge/fallback_rate"] == 0.0
