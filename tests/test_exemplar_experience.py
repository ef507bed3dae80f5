"""Self-Navigating with exemplars (``exp_manager.experience_kind: exemplar``): solved episodes stored whole as
worked examples, the most similar one injected in the environment's demonstration form, stripped again for
"discard" training.

Everything is the product except the policy: the calc environment service and the memory service run as
real subprocesses (``uvicorn`` behind their ``python -m`` entry points), episodes run through the real agent
flow with the real SmolLM2 tokenizer and chat template, and the memory service is started *with* an LLM (a
scripted OpenAI-compatible server that records every request) to prove exemplar mode never asks it. The
policy is scripted text, so which episodes are solved is chosen by the test.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from env_service_fixture import env_service
from memory_service_fixture import Service, memory_service
from omegaconf import OmegaConf
from pydantic import ValidationError
from scripted_openai_server import ScriptedOpenAIServer, shared_scripted_llm_server
from transformers import AutoTokenizer
from verl.workers.rollout.replica import TokenOutput

from agentevolver.client.env_client import EnvClient, EnvClientSettings
from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings
from agentevolver.config import compose_config
from agentevolver.config.schema import ExpManagerSection
from agentevolver.memory_service.exemplar import episode_messages, render_exemplar
from agentevolver.models import resolve_model_path
from agentevolver.module.agent_flow import AgentFlow, AgentFlowConfig, EpisodeResult, EpisodeSpec
from agentevolver.module.exp_manager.retriever import ExperienceRetriever, format_experience
from agentevolver.module.exp_manager.summarizer import BackgroundSummarizer, trajectories_from_records
from agentevolver.module.tools import ToolRegistry
from agentevolver.schema.memory_wire import memory_kind
from agentevolver.schema.message import ChatMessage
from env_service.environments.calc.prompts import demonstrations
from env_service.environments.calc.tasks import get_task

MODEL = "smollm2-135m-instruct"
TEMPLATE = compose_config([]).exp_manager.exemplar_template  # the shipped default
SOLVED = ("train-single-000", "train-word-000", "train-convert-000")
UNSOLVED = "train-word-002"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path(MODEL))


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ScriptedPolicy:
    """verl's ``generate`` signature; each call answers the next scripted text (real tokenizer ids + EOS)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.prompts: list[list[int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any]) -> TokenOutput:
        self.prompts.append(list(prompt_ids))
        text = self.replies.pop(0) if self.replies else "FINAL ANSWER: 0"
        ids = [*tokenizer().encode(text, add_special_tokens=False), tokenizer().eos_token_id]
        ids = ids[: sampling_params["max_tokens"]]
        return TokenOutput(token_ids=ids, log_probs=[-0.1] * len(ids), stop_reason="completed")


def solving(task_id: str, *, wrong_by: float = 0.0) -> list[str]:
    """The two turns that solve a calc task (call its tool, report the result); ``wrong_by`` spoils the answer."""
    task = get_task(task_id)
    return [call(task.solution["name"], task.solution["arguments"]), f"FINAL ANSWER: {task.answer + wrong_by:g}"]


# ----------------------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def llm() -> ScriptedOpenAIServer:
    return shared_scripted_llm_server()


@pytest.fixture(scope="module")
def memory(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedOpenAIServer) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("exemplar_memory")
    with memory_service(folder / "data", folder / "service.log", "--llm-base-url", llm.base_url,
                        "--llm-model", "scripted-model") as running:
        yield running


@pytest.fixture(scope="module")
def env_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with env_service("calc", tmp_path=tmp_path_factory.mktemp("exemplar_env")) as running:
        yield running.url


@pytest.fixture
async def env(env_url: str) -> Any:
    client = EnvClient(EnvClientSettings(env_url=env_url, max_retries=1, backoff_initial_s=0.05, backoff_max_s=0.1))
    yield client
    await client.aclose()


def client(url: str) -> MemoryClient:
    return MemoryClient(MemoryClientSettings(base_url=url, timeout_s=120, max_retries=1, backoff_initial_s=0.01,
                                             backoff_max_s=0.05))


def retriever(url: str, workspace: str, top_k: int = 1) -> ExperienceRetriever:
    return ExperienceRetriever(client(url), workspace_id=workspace, top_k=top_k, template=TEMPLATE, kind="exemplar")


def flow(env: EnvClient, policy: ScriptedPolicy, experience: ExperienceRetriever | None = None) -> AgentFlow:
    return AgentFlow(AgentFlowConfig.model_validate({"max_steps": 3}), tokenizer=tokenizer(), env_client=env,
                     generate=policy.generate, max_model_len=4096, tool_registry=ToolRegistry(),
                     retriever=experience)


async def episode(env: EnvClient, task_id: str, replies: list[str], *, experience: ExperienceRetriever | None = None,
                  **fields: Any) -> tuple[EpisodeResult, ScriptedPolicy]:
    policy = ScriptedPolicy(replies)
    spec = EpisodeSpec(task_id=task_id, env_type="calc", group_id=fields.pop("group_id", task_id),
                       env_params={"demos": 2}, **fields)
    return await flow(env, policy, experience).run(spec, SAMPLING), policy


async def fill(env: EnvClient, url: str, workspace: str) -> list[dict[str, Any]]:
    """Roll out the solved tasks and the unsolved one; send them as the trainer does (exemplar mode)."""
    runs = [await episode(env, t, solving(t)) for t in SOLVED] + [
        await episode(env, UNSOLVED, solving(UNSOLVED, wrong_by=10))]
    results = [r for r, _ in runs]
    assert [r.success for r in results] == [True, True, True, False]
    records = [r.to_dump_record(step=1) for r in results]
    trajectories = trajectories_from_records(records, [r.reward.outcome for r in results], kind="exemplar")
    summarizer = BackgroundSummarizer(client(url), workspace, batch_size=8, kind="exemplar")
    try:
        summarizer.submit(trajectories)
        metrics = await asyncio.to_thread(summarizer.wait)
    finally:
        summarizer.close()
    assert metrics["exp/summary_failed"] == 0, metrics
    return trajectories


# ----------------------------------------------------------------------------------------- the form


def test_an_exemplar_reads_like_the_environments_demonstrations() -> None:
    """Every turn of the rendered exemplar is, character for character, a turn the chat template shows the
    agent for calc's own demonstrations (OpenAI form: tool_calls, tool messages)."""
    demo = demonstrations(2)[4:]  # the second worked example: question, call, tool result, answer
    shown = tokenizer().apply_chat_template([m.model_dump(exclude_none=True) for m in demo], tokenize=False)
    rendered = render_exemplar(demo)
    turns = re.split(r"\n(?=(?:user|assistant): )", rendered)
    assert len(turns) == 4
    for turn in turns:
        role, text = turn.split(": ", 1)
        assert f"<|im_start|>{role}\n{text}<|im_end|>" in shown, turn
    assert rendered.startswith("user: A box holds 15 eggs.") and rendered.endswith("assistant: FINAL ANSWER: 90")


def test_generated_calls_are_not_shown_twice_and_the_task_starts_the_exemplar() -> None:
    generated = call("calculator", {"expression": "2 + 3"})
    messages = [ChatMessage(role="system", content="You are a math assistant."),
                ChatMessage(role="user", content="What is 2 + 3?"),
                ChatMessage.model_validate({"role": "assistant", "content": generated, "tool_calls": [
                    {"id": "c1", "function": {"name": "calculator", "arguments": {"expression": "2 + 3"}}}]}),
                ChatMessage(role="tool", content="5", tool_call_id="c1", name="calculator"),
                ChatMessage(role="assistant", content="FINAL ANSWER: 5")]
    assert [m.role for m in episode_messages(messages)] == ["user", "assistant", "tool", "assistant"]
    assert render_exemplar(messages) == (
        f"user: What is 2 + 3?\nassistant: {generated}\nuser: <tool_response>\n5\n</tool_response>\n"
        "assistant: FINAL ANSWER: 5")


# ----------------------------------------------------------------------------------------- store and retrieve


async def test_solved_episodes_are_stored_whole_without_an_llm_and_unsolved_ones_are_not(
        env: EnvClient, memory: Service, llm: ScriptedOpenAIServer) -> None:
    llm.reset()
    trajectories = await fill(env, memory.url, "ex-store")
    assert llm.requests == []  # exemplar mode asked the service's LLM nothing
    stored = client(memory.url).list_memories("ex-store")
    assert sorted(m.when_to_use for m in stored) == sorted(get_task(t).query for t in SOLVED)
    assert all(memory_kind(m) == "exemplar" and m.score == 1.0 for m in stored)
    word = next(m for m in stored if m.metadata["task_id"] == "train-word-000")
    sent = next(t for t in trajectories if t["task_id"] == "train-word-000")
    assert word.content == render_exemplar([ChatMessage.model_validate(m) for m in sent["messages"]])
    assert word.content.startswith(f"user: {get_task('train-word-000').query}\nassistant: <tool_call>")
    assert "<tool_response>\n44\n</tool_response>" in word.content and word.content.endswith("FINAL ANSWER: 44")
    assert "A box holds 15 eggs" not in word.content  # the opening demonstrations are not part of the exemplar

    # The same solved episode again: one task keeps one exemplar; the request says so.
    again = client(memory.url).summary("ex-store", [sent], experience_kind="exemplar")
    assert (again.metadata.stats.stored, again.metadata.stats.duplicates) == (0, 1)
    # A better (shorter) solution of that task replaces the stored one under the same memory id.
    shorter = {**sent, "messages": [sent["messages"][0], {"role": "assistant", "content": "FINAL ANSWER: 44"}]}
    better = client(memory.url).summary("ex-store", [shorter], experience_kind="exemplar")
    assert (better.metadata.stats.stored, better.metadata.stats.replaced) == (1, 1)
    assert better.metadata.memory_list[0].memory_id == word.memory_id
    assert len(client(memory.url).list_memories("ex-store")) == len(SOLVED)
    assert llm.requests == []


async def test_the_most_similar_solved_episode_is_retrieved_as_a_worked_example(
        env: EnvClient, memory: Service) -> None:
    await fill(env, memory.url, "ex-retrieve")
    stored = {m.metadata["task_id"]: m for m in client(memory.url).list_memories("ex-retrieve")}
    cases = {"A farmer picked 90 pears and sold 35 of them. How many pears are left?": "train-word-000",
             "Convert 5 days to hours.": "train-convert-000",
             "Calculate 912 / 4.": "train-single-000"}
    for query, task_id in cases.items():
        got = await retriever(memory.url, "ex-retrieve").for_episode(f"g-{task_id}", [
            ChatMessage(role="system", content="You are a math assistant."), ChatMessage(role="user", content=query)])
        assert got.error is None and got.experience == format_experience(TEMPLATE, stored[task_id].content), query


async def test_advice_and_exemplars_share_a_workspace_and_old_requests_see_both(
        env: EnvClient, memory: Service, tmp_path: Path) -> None:
    await fill(env, memory.url, "ex-mixed")
    advice = tmp_path / "advice.jsonl"
    advice.write_text(json.dumps({"when_to_use": "apples sold word problem", "content": "ADVICE: subtract."}) + "\n")
    client(memory.url).import_jsonl("ex-mixed", advice)
    query = "A farmer picked 90 apples and sold 35 of them. How many apples are left?"
    # A request without experience_kind is ReMe's: every memory, numbered advice blocks (the wire is unchanged).
    assert "experience_kind" not in MemoryClient._retrieve_body("ex-mixed", query, 5)
    assert "experience_kind" not in MemoryClient._summary_body("ex-mixed", [{"messages": [
        {"role": "user", "content": "q"}], "score": 1.0}])
    plain = client(memory.url).retrieve("ex-mixed", query, top_k=4)
    assert {memory_kind(m) for m in plain.metadata.memory_list} == {"advice", "exemplar"}
    assert plain.answer.startswith("Experience 1 (applies when:")
    exemplars = client(memory.url).retrieve("ex-mixed", query, top_k=4, experience_kind="exemplar")
    assert [memory_kind(m) for m in exemplars.metadata.memory_list] == ["exemplar"] * 3
    assert exemplars.answer.startswith("user: A farmer picked 70 apples") and "ADVICE" not in exemplars.answer
    only_advice = client(memory.url).retrieve("ex-mixed", query, top_k=4, experience_kind="advice")
    assert [m.content for m in only_advice.metadata.memory_list] == ["ADVICE: subtract."]


# ----------------------------------------------------------------------------------------- inject and strip


@pytest.mark.parametrize("train_mode", ["keep", "discard"])
async def test_the_exemplar_is_in_the_prompt_and_only_discard_strips_it_for_training(
        env: EnvClient, memory: Service, train_mode: str) -> None:
    await fill(env, memory.url, "ex-inject")
    task = "train-word-001"  # not stored: the exemplar comes from a similar solved task
    guided, policy = await episode(env, task, solving(task), experience=retriever(memory.url, "ex-inject"),
                                   add_experience=True, train_mode=train_mode, group_id=f"g-{train_mode}")
    plain, _ = await episode(env, task, solving(task), group_id=f"plain-{train_mode}")
    assert guided.success and guided.metrics["exp/injected"] == 1.0
    exemplar = next(m["content"] for m in guided.messages if m["author"] == "experience")
    assert exemplar.startswith(TEMPLATE.split("{}")[0] + "user: ") and "FINAL ANSWER" in exemplar
    worked = exemplar[len(TEMPLATE.split("{}")[0]):].split("\n\nNow solve")[0]
    generated_from = tokenizer().decode(policy.prompts[0])
    assert f"{get_task(task).query}{exemplar}<|im_end|>" in generated_from  # right after the task, in its turn

    sample, reference = guided.final_sample, plain.final_sample
    trained = tokenizer().decode(sample.prompt_ids)
    assert sample.response_ids == reference.response_ids
    if train_mode == "discard":
        assert worked not in trained and "A solved example" not in trained
        assert sample.prompt_ids == reference.prompt_ids and sample.exp_mask is True  # token for token
    else:
        assert worked in trained and sample.exp_mask is False
        start, end = sample.extras["experience_span"]
        assert tokenizer().decode(sample.prompt_ids[start:end]) == exemplar


# ----------------------------------------------------------------------------------------- the switch


def _exp_section(**overrides: Any) -> dict[str, Any]:
    section = OmegaConf.to_container(compose_config([]).exp_manager, resolve=True)
    assert isinstance(section, dict)
    return {**section, **overrides}


def test_the_switch_is_validated_naming_the_key() -> None:
    assert ExpManagerSection.model_validate(_exp_section()).experience_kind == "advice"
    assert ExpManagerSection.model_validate(_exp_section(experience_kind="exemplar")).experience_kind == "exemplar"
    with pytest.raises(ValidationError, match="experience_kind"):
        ExpManagerSection.model_validate(_exp_section(experience_kind="demos"))
    with pytest.raises(ValidationError, match=r"exp_manager\.exemplar_template must contain '\{\}'"):
        ExpManagerSection.model_validate(_exp_section(exemplar_template="no slot"))


def test_the_retriever_follows_the_switch() -> None:
    cfg = compose_config(["exp_manager.experience_kind=exemplar"])
    picked = ExperienceRetriever.from_config(cfg)
    assert (picked.kind, picked.template) == ("exemplar", cfg.exp_manager.exemplar_template)
    default = ExperienceRetriever.from_config(compose_config([]))
    assert (default.kind, default.template) == ("advice", cfg.exp_manager.experience_template)
    with pytest.raises(ValueError, match="experience_kind must be one of advice, exemplar"):
        ExperienceRetriever(picked.client, workspace_id="w", top_k=1, template="{}", kind="demos")  # type: ignore[arg-type]
