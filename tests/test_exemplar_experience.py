"""Self-Navigating with exemplars (``exp_manager.experience_kind: exemplar``): solved episodes stored whole as
worked examples, the most similar one injected as chat turns before the task's question (the environment's
demonstration form), in two tool-call dialects, stripped again token for token for "discard" training.

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
from agentevolver.module.exp_manager.retriever import ExperienceRetriever
from agentevolver.module.exp_manager.summarizer import BackgroundSummarizer, trajectories_from_records
from agentevolver.module.tools import ToolRegistry
from agentevolver.schema.memory_wire import memory_kind
from agentevolver.schema.message import ChatMessage
from env_service.environments.calc.prompts import demonstrations
from env_service.environments.calc.tasks import get_task

MODEL = "smollm2-135m-instruct"
SOLVED = ("train-single-000", "train-word-000", "train-convert-000")
UNSOLVED = "train-word-002"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@cache
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(resolve_model_path(MODEL))


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def qwen3_coder_call(name: str, arguments: dict[str, Any]) -> str:
    """The same call in Qwen3-Coder's XML dialect (``agent_flow.tools.tool_parser: qwen3_coder``)."""
    params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


#: tool-call dialect -> (the parser's config name, how the scripted policy writes a call in it)
DIALECTS = {"hermes": ("hermes", call), "qwen3_coder": ("qwen3_coder", qwen3_coder_call)}


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


def solving(task_id: str, *, wrong_by: float = 0.0, dialect: str = "hermes") -> list[str]:
    """The two turns that solve a calc task (call its tool, report the result); ``wrong_by`` spoils the answer."""
    task = get_task(task_id)
    write = DIALECTS[dialect][1]
    return [write(task.solution["name"], task.solution["arguments"]), f"FINAL ANSWER: {task.answer + wrong_by:g}"]


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
    return ExperienceRetriever(client(url), workspace_id=workspace, top_k=top_k, kind="exemplar")


def flow(env: EnvClient, policy: ScriptedPolicy, experience: ExperienceRetriever | None = None,
         dialect: str = "hermes") -> AgentFlow:
    config = {"max_steps": 3, "tools": {"tool_parser": DIALECTS[dialect][0]}}
    return AgentFlow(AgentFlowConfig.model_validate(config), tokenizer=tokenizer(), env_client=env,
                     generate=policy.generate, max_model_len=4096, tool_registry=ToolRegistry(),
                     retriever=experience)


async def episode(env: EnvClient, task_id: str, replies: list[str], *, experience: ExperienceRetriever | None = None,
                  dialect: str = "hermes", **fields: Any) -> tuple[EpisodeResult, ScriptedPolicy]:
    policy = ScriptedPolicy(replies)
    spec = EpisodeSpec(task_id=task_id, env_type="calc", group_id=fields.pop("group_id", task_id),
                       env_params={"demos": 2}, **fields)
    return await flow(env, policy, experience, dialect).run(spec, SAMPLING), policy


async def fill(env: EnvClient, url: str, workspace: str, dialect: str = "hermes") -> list[dict[str, Any]]:
    """Roll out the solved tasks and the unsolved one; send them as the trainer does (exemplar mode)."""
    runs = [await episode(env, t, solving(t, dialect=dialect), dialect=dialect) for t in SOLVED] + [
        await episode(env, UNSOLVED, solving(UNSOLVED, wrong_by=10, dialect=dialect), dialect=dialect)]
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
        expected = [ChatMessage.model_validate(m) for m in stored[task_id].metadata["messages"]]
        assert got.error is None and got.experience == expected, query  # the stored messages, as turns
        assert [m.role for m in expected] == ["user", "assistant", "tool", "assistant"]


async def test_an_episode_is_never_shown_its_own_tasks_exemplar(env: EnvClient, memory: Service) -> None:
    """Its own task is excluded by id (the service's ``exclude_task_ids``) and by text (memories without an
    id); the next most similar solved task is retrieved instead, and top_k puts the most similar last."""
    await fill(env, memory.url, "ex-self")
    own = get_task("train-word-000")
    opening = [ChatMessage(role="user", content=own.query)]
    by_id = await retriever(memory.url, "ex-self").for_episode("g1", opening, task_id=own.task_id)
    assert by_id.experience and by_id.experience[0].content != own.query
    raw = client(memory.url).retrieve("ex-self", own.query, top_k=3, experience_kind="exemplar",
                                      exclude_task_ids=[own.task_id])
    assert own.task_id not in {m.metadata["task_id"] for m in raw.metadata.memory_list}
    by_text = await retriever(memory.url, "ex-self", top_k=3).for_episode("g2", opening)  # no task id sent
    questions = [m.content for m in by_text.experience or [] if m.role == "user"]
    assert own.query not in questions and len(questions) == 2
    nearest = client(memory.url).retrieve("ex-self", own.query, top_k=3, experience_kind="exemplar")
    order = [m.when_to_use for m in nearest.metadata.memory_list if m.when_to_use != own.query]
    assert questions == order[::-1]  # the most similar next to the question


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


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize("train_mode", ["keep", "discard"])
async def test_the_exemplar_is_turns_before_the_question_and_discard_strips_them_token_exactly(
        env: EnvClient, memory: Service, train_mode: str, dialect: str) -> None:
    workspace = f"ex-inject-{dialect}"
    await fill(env, memory.url, workspace, dialect)
    task = "train-word-001"  # not stored: the exemplar comes from a similar solved task
    guided, policy = await episode(env, task, solving(task, dialect=dialect), dialect=dialect,
                                   experience=retriever(memory.url, workspace), add_experience=True,
                                   train_mode=train_mode, group_id=f"g-{train_mode}-{dialect}")
    plain, plain_policy = await episode(env, task, solving(task, dialect=dialect), dialect=dialect,
                                        group_id=f"plain-{train_mode}-{dialect}")
    assert guided.success and guided.metrics["exp/injected"] == 1.0
    turns = [m for m in guided.messages if m["author"] == "experience"]
    assert [m["role"] for m in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1]["content"].startswith(DIALECTS[dialect][1]("calculator", {})[:12])  # the policy's dialect
    assert "tool_calls" not in turns[1]  # the generated text holds the call: not shown twice
    # The prompt it generated from: opening demonstrations, the exemplar's turns, then the question.
    opening = [ChatMessage.model_validate({k: v for k, v in m.items() if k in ("role", "content", "tool_calls",
                                                                              "tool_call_id", "name")})
               for m in guided.messages if m.get("step", -1) < 0]
    expected = tokenizer().apply_chat_template([m.model_dump(exclude_none=True) for m in opening],
                                               tools=await env.atools("calc"), tokenize=False,
                                               add_generation_prompt=True)
    assert tokenizer().decode(policy.prompts[0]) == expected
    assert opening[-1].content == get_task(task).query and opening[-5].content == turns[0]["content"]

    sample, reference = guided.final_sample, plain.final_sample
    assert sample.response_ids == reference.response_ids
    if train_mode == "discard":  # the trained sample is the episode as it would have been without them
        assert sample.prompt_ids == reference.prompt_ids and sample.exp_mask is True
        assert sample.prompt_ids == plain_policy.prompts[0]
    else:
        assert sample.exp_mask is False and sample.prompt_ids == policy.prompts[0]
        start, end = sample.extras["experience_span"]
        assert sample.prompt_ids[:start] + sample.prompt_ids[end:] == reference.prompt_ids
        shown = tokenizer().decode(sample.prompt_ids[start:end])
        assert shown.startswith("<|im_start|>user\n" + turns[0]["content"]) and shown.endswith("<|im_end|>\n")


def test_exemplar_turns_in_the_demonstration_form_are_rendered_by_the_template_and_stripped_exactly() -> None:
    """Turns whose calls are only ``tool_calls`` (calc's demonstration form, or another dialect's memory) are
    written by the chat template in its own dialect; the span cut equals the rendering without them."""
    from agentevolver.module.context_manager import make_context_manager

    opening = [ChatMessage(role="system", content="You are a math assistant."),
               ChatMessage(role="user", content="What is 7 * 6?")]
    demo = demonstrations(2)[4:]
    cm = make_context_manager("linear", tokenizer(), {"max_model_len": 4096})
    ids = cm.start(opening, experience=demo)
    rendered = tokenizer().apply_chat_template([m.model_dump(exclude_none=True) for m in [opening[0], *demo,
                                                opening[1]]], tokenize=False, add_generation_prompt=True)
    assert tokenizer().decode(ids) == rendered and '"name": "calculator"' in rendered
    bare = make_context_manager("linear", tokenizer(), {"max_model_len": 4096}).start(opening)
    start, end = cm.results()[0].experience_span
    assert ids[:start] + ids[end:] == bare
    # whole turns, header to closing (the turns and the question both open with "<|im_start|>user", so a span
    # shifted by one header would cut to the same ids; the recorded one starts where the turns start)
    shown = tokenizer().decode(ids[start:end])
    assert shown.startswith(f"<|im_start|>user\n{demo[0].content}<|im_end|>") and shown.endswith("<|im_end|>\n")
    assert cm.results(strip_experience=True)[0].prompt_ids == bare
    with pytest.raises(ValueError, match="before the task's question"):
        make_context_manager("linear", tokenizer(), {"max_model_len": 4096}).start(
            [*opening, ChatMessage(role="assistant", content="hi")], experience=demo)


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
    with pytest.raises(ValidationError, match=r"exp_manager\.experience_template must contain '\{\}'"):
        ExpManagerSection.model_validate(_exp_section(experience_template="no slot"))


def test_the_retriever_follows_the_switch() -> None:
    picked = ExperienceRetriever.from_config(compose_config(["exp_manager.experience_kind=exemplar"]))
    assert picked.kind == "exemplar"
    default = ExperienceRetriever.from_config(compose_config([]))
    assert (default.kind, default.template) == ("advice", compose_config([]).exp_manager.experience_template)
    with pytest.raises(ValueError, match="experience_kind must be one of advice, exemplar"):
        ExperienceRetriever(picked.client, workspace_id="w", top_k=1, template="{}", kind="demos")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"experience_template must contain '\{\}'"):
        ExperienceRetriever(picked.client, workspace_id="w", top_k=1, template="no slot")
