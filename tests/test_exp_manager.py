"""Self-Navigating's experience manager: the seeded draws, the retriever and the background summariser
against the real memory service (a scripted OpenAI-compatible server plays its summariser LLM), and the
start-up checks. The training path through ``main_ppo`` is tests/test_exp_modes.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memory_service_fixture import Service, memory_service, task_summariser
from ports import free_port
from scripted_openai_server import ScriptedOpenAIServer, shared_scripted_llm_server

from agentevolver.client.memory_client import MemoryClient, MemoryClientSettings
from agentevolver.config import compose_config, validate_config
from agentevolver.errors import ConfigError
from agentevolver.module.exp_manager import (
    allocate_add_experience,
    allocate_train_modes,
    plan_rows,
    seeded_rng,
)
from agentevolver.module.exp_manager.manager import ExperienceManager, check_settings, compare_key, draw_plan
from agentevolver.module.exp_manager.retriever import ExperienceRetriever, format_experience, task_query
from agentevolver.module.exp_manager.summarizer import (
    BackgroundSummarizer,
    summary_requests,
    trajectories_from_records,
)
from agentevolver.schema.message import ChatMessage

# ----------------------------------------------------------------------------------------- the draws


@given(n=st.integers(0, 64), ratio=st.floats(0.0, 1.0), seed=st.integers(0, 10))
def test_hybrid_keeps_the_rounded_share_of_tasks(n: int, ratio: float, seed: int) -> None:
    modes = allocate_train_modes(n, "hybrid", ratio, seeded_rng(seed, "train", 1))
    assert len(modes) == n and modes.count("keep") == min(n, round(n * ratio))


@given(n=st.integers(0, 32), ratio=st.floats(0.0, 1.0))
def test_mixed_guides_the_rounded_share_of_a_group(n: int, ratio: float) -> None:
    flags = allocate_add_experience(n, "mixed", ratio, seeded_rng(0, "train", 3))
    assert len(flags) == n and sum(flags) == min(n, round(n * ratio))


def test_fixed_modes_ignore_the_ratios() -> None:
    rng = seeded_rng(0, "train", 1)
    assert allocate_train_modes(5, "allkeep", 0.0, rng) == ["keep"] * 5
    assert allocate_train_modes(5, "alldiscard", 1.0, rng) == ["discard"] * 5
    assert allocate_add_experience(4, "woexp", 1.0, rng) == [False] * 4
    assert allocate_add_experience(4, "all", 0.0, rng) == [True] * 4


def _plan(step: int, split: str = "train", uids: list[str] | None = None):
    uids = uids or [u for u in ("a", "b", "c", "d") for _ in range(4)]  # verl's interleaved repeat: a a a a b ...
    return plan_rows(uids, rollout_mode="mixed", rollout_ratio=0.5, sample_mode="hybrid", keep_ratio=0.5,
                     rng=seeded_rng(7, split, step))


def test_plan_is_per_group_exact_and_reproducible() -> None:
    plan = _plan(step=3)
    assert plan == _plan(step=3)  # same seed, split and step: same draw (a resumed run draws the same)
    groups = [slice(0, 4), slice(4, 8), slice(8, 12), slice(12, 16)]
    assert [sum(plan.add_experience[g]) for g in groups] == [2, 2, 2, 2]
    assert all(len(set(plan.train_mode[g])) == 1 for g in groups)  # the train mode is the task's
    assert Counter(plan.train_mode[g][0] for g in groups) == {"keep": 2, "discard": 2}
    draws = {tuple(_plan(step=s).add_experience) for s in range(1, 9)}
    assert len(draws) > 1  # other steps draw otherwise
    assert _plan(3, "val").add_experience != plan.add_experience or _plan(4, "val") != _plan(4)


def test_plan_groups_rows_by_uid_wherever_they_are() -> None:
    plan = _plan(step=2, uids=["a", "b", "a", "b", "a", "b", "a", "b"])
    assert sum(plan.add_experience[0::2]) == 2 and sum(plan.add_experience[1::2]) == 2


# ----------------------------------------------------------------------------------------- pure helpers


def test_summary_requests_keep_a_task_together_and_respect_the_batch_size() -> None:
    trajectories = [{"task_id": t, "score": 1.0, "messages": []} for t in "aaabbbbbc"]
    requests = summary_requests(trajectories, 4)
    assert all(len(r) <= 4 for r in requests) and sum(len(r) for r in requests) == 9
    assert [[t["task_id"] for t in r] for r in requests] == [["a", "a", "a"], ["b", "b", "b", "b"], ["b", "c"]]


def test_trajectories_leave_out_injected_experience_and_failed_episodes() -> None:
    def record(termination: str, turns: int = 1) -> dict:
        return {"task_id": "t0", "termination": termination, "num_turns": turns, "messages": [
            {"role": "user", "content": "Task t0: say something.", "author": "env"},
            {"role": "user", "content": "EXP: old advice", "author": "experience"},
            {"role": "assistant", "content": "hi", "author": "llm"}]}
    out = trajectories_from_records([record("finished"), record("env_error"), record("max_steps", 0)], [1.0, 0, 0])
    assert out == [{"task_id": "t0", "score": 1.0, "messages": [
        {"role": "user", "content": "Task t0: say something."}, {"role": "assistant", "content": "hi"}]}]


def test_template_and_query() -> None:
    assert format_experience("<EXP>{}</EXP> {x}", "use {y}") == "<EXP>use {y}</EXP> {x}"
    messages = [ChatMessage(role="system", content="s"), ChatMessage(role="user", content="Task t3: go")]
    assert task_query(messages) == "Task t3: go"


# ----------------------------------------------------------------------------------------- config checks


def _settings(*overrides: str):
    settings = validate_config(compose_config(list(overrides)))
    return settings.exp_manager, settings.memory


def test_init_only_without_init_is_an_error_naming_the_keys() -> None:
    with pytest.raises(ConfigError, match=r"init_exp_only.*init_exp_before_training"):
        check_settings(*_settings("exp_manager.init_exp_only=true"), "vanilla")


def test_the_second_validation_pass_needs_experience_and_another_mode() -> None:
    with pytest.raises(ConfigError, match=r"val_compare_mode=all but memory\.enable_context_generator is false"):
        check_settings(*_settings("exp_manager.val_compare_mode=all"), "vanilla")
    exp, memory = _settings("exp_mode=init_train", "exp_manager.val_compare_mode=all")
    assert check_settings(exp, memory, "exp_on_off") == []
    with pytest.raises(ConfigError, match=r"val_compare_mode=woexp is val_rollout_mode's mode"):
        _settings("exp_mode=init_train", "exp_manager.val_compare_mode=woexp")
    with pytest.raises(ConfigError, match=r"val_compare_at"):
        _settings("exp_mode=init_train", "exp_manager.val_compare_mode=all", "exp_manager.val_compare_at=last")


def test_the_second_validation_pass_plans_its_own_mode() -> None:
    exp, _memory = _settings("exp_mode=init_train", "exp_manager.val_compare_mode=all")
    uids = [u for u in ("a", "b") for _ in range(2)]
    assert draw_plan(exp, uids, validate=True, step=6).add_experience == [False] * 4  # val_rollout_mode woexp
    assert draw_plan(exp, uids, validate=True, step=6, rollout_mode="all").add_experience == [True] * 4
    assert compare_key("val-core/calc/acc/mean@1", "all") == "val-exp_all-core/calc/acc/mean@1"
    assert compare_key("val-aux/num_turns/min", "all") == "val-exp_all-aux/num_turns/min"


def test_presets_pass_the_checks_and_odd_combinations_warn() -> None:
    for mode in ("no_pool", "init_only", "init_train", "init_train_update", "exist_train", "exist_train_update"):
        cfg = compose_config([f"exp_mode={mode}"])
        settings = validate_config(cfg)
        assert check_settings(settings.exp_manager, settings.memory,
                              str(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)) == [], mode
    warnings = check_settings(*_settings("exp_mode=init_train", "memory.updated_freq=3"), "vanilla")
    assert any("enable_summarizer" in w for w in warnings) and any("exp_on_off" in w for w in warnings)


def test_only_the_update_modes_summarise_during_training() -> None:
    """What separates init_train / exist_train from their *_update twins (whose training runs are in the default
    suite, tests/test_exp_modes.py): the trainer's memory_summary stage never submits a summary."""
    for mode, updates in (("init_train", False), ("exist_train", False), ("init_train_update", True),
                          ("exist_train_update", True)):
        cfg = compose_config([f"exp_mode={mode}"])
        manager = ExperienceManager.from_config(cfg, validate_config(cfg))
        assert manager.active, mode
        assert any(manager.summaries_due(step) for step in range(1, 20)) == updates, mode
    init_train, exist_train = compose_config(["exp_mode=init_train"]), compose_config(["exp_mode=exist_train"])
    assert ExperienceManager.from_config(init_train, validate_config(init_train)).exp.init_exp_before_training
    assert not ExperienceManager.from_config(exist_train, validate_config(exist_train)).exp.init_exp_before_training


# ----------------------------------------------------------------------------------------- against the service


@pytest.fixture(scope="module")
def llm() -> ScriptedOpenAIServer:
    return shared_scripted_llm_server()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, llm: ScriptedOpenAIServer) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("exp_memory")
    with memory_service(folder / "data", folder / "service.log", "--llm-base-url", llm.base_url,
                        "--llm-model", "scripted-model") as running:
        yield running


def _client(url: str) -> MemoryClient:
    return MemoryClient(MemoryClientSettings(base_url=url, timeout_s=120, max_retries=1, backoff_initial_s=0.01,
                                             backoff_max_s=0.05))


def _episode(task: str, score: float) -> dict:
    return {"task_id": task, "score": score, "messages": [
        {"role": "user", "content": f"Task {task}: say something."}, {"role": "assistant", "content": "ok"}]}


def test_background_summaries_fill_the_memory_and_retrieval_finds_them(service: Service, llm) -> None:
    llm.reset()
    llm.respond_with(task_summariser)
    summarizer = BackgroundSummarizer(_client(service.url), "bg", batch_size=2)
    try:
        assert summarizer.submit([_episode("t1", 1.0), _episode("t1", 0.0), _episode("t2", 1.0)]) == 2
        metrics = summarizer.wait()
    finally:
        summarizer.close()
    assert metrics["exp/summary_finished"] == 2 and metrics["exp/summary_failed"] == 0
    assert metrics["exp/summary_stored"] >= 2

    retriever = ExperienceRetriever(_client(service.url), workspace_id="bg", top_k=1, template="<EXP>{}</EXP>")
    opening = [ChatMessage(role="system", content="Answer."), ChatMessage(role="user", content="Task t2: say something.")]

    async def four_rollouts_of_one_group() -> list:
        return await asyncio.gather(*(retriever.for_episode("group-1", opening) for _ in range(4)))

    before = retriever.client.stats["requests"]
    results = asyncio.run(four_rollouts_of_one_group())
    assert retriever.client.stats["requests"] - before == 1  # one request for the group's four episodes
    assert all(r.error is None and r.experience.startswith("<EXP>") and "EXP-t2" in r.experience for r in results)
    assert "EXP-t1" not in results[0].experience  # top-1: the related task's experience


def test_memory_service_down_counts_failures_and_never_raises(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    summarizer = BackgroundSummarizer(_client(dead), "w", batch_size=8)
    try:
        summarizer.submit([_episode("t1", 1.0)])
        metrics = summarizer.wait()
    finally:
        summarizer.close()
    assert metrics["exp/summary_failed"] == 1 and metrics["exp/summary_stored"] == 0
    retriever = ExperienceRetriever(_client(dead), workspace_id="w", top_k=1, template="{}")
    result = asyncio.run(retriever.for_episode("g", [ChatMessage(role="user", content="Task t1: go")]))
    assert result.experience is None and "ConnectError" in result.error


def test_exist_train_on_an_empty_workspace_stops_at_start_up(service: Service) -> None:
    exp, memory = _settings("exp_mode=exist_train", f"memory.base_url={service.url}", "memory.workspace_id=empty-ws")
    with pytest.raises(ConfigError, match=r"memory\.workspace_id: workspace .empty-ws."):
        ExperienceManager(exp, memory).check_memory()
    exp, memory = _settings("exp_mode=exist_train_update", f"memory.base_url={service.url}",
                            "memory.workspace_id=empty-ws")
    ExperienceManager(exp, memory).check_memory()  # the run's own summaries will fill it: fine
    exp, memory = _settings("exp_mode=exist_train", f"memory.base_url=http://127.0.0.1:{free_port()}")
    ExperienceManager(exp, memory).check_memory()  # down: a warning, training runs without experience


def test_a_run_from_step_0_builds_its_initial_memory_in_an_emptied_workspace(service: Service, llm) -> None:
    """A killed run redone from scratch under the same experiment name must not retrieve its first attempt's
    experiences too: the initial memory starts from an empty workspace, unless told to keep it."""
    llm.reset()
    llm.respond_with(task_summariser)

    def leftover(workspace: str) -> int:
        summarizer = BackgroundSummarizer(_client(service.url), workspace, batch_size=2)
        try:
            summarizer.submit([_episode("t1", 1.0), _episode("t2", 1.0)])
            summarizer.wait()
        finally:
            summarizer.close()
        return _client(service.url).workspaces()[workspace]

    assert leftover("redo-ws") >= 1
    exp, memory = _settings("exp_mode=init_train", f"memory.base_url={service.url}", "memory.workspace_id=redo-ws")
    manager = ExperienceManager(exp, memory)
    try:
        metrics = manager.initial_summary([])  # no solved episode this time: the memory is empty after it
    finally:
        manager.close()
    assert metrics["exp/init_cleared"] >= 1 and _client(service.url).workspaces().get("redo-ws", 0) == 0

    kept = leftover("keep-ws")
    exp, memory = _settings("exp_mode=init_train", "exp_manager.init_exp_clear_workspace=false",
                            f"memory.base_url={service.url}", "memory.workspace_id=keep-ws")
    manager = ExperienceManager(exp, memory)
    try:
        assert manager.initial_summary([])["exp/init_cleared"] == 0
    finally:
        manager.close()
    assert _client(service.url).workspaces()["keep-ws"] == kept
