"""Exploration seeds (split ``explore``, one per tool, not tasks) in every built-in environment that offers them.

calc's are tested with the task writer in tests/test_sq_from_nothing.py; here codebox's (in process) and mcp's,
through the real env service serving ``mcp-server-time``: mcp lists the seeds in ``explore`` even when a task
file gives it tasks of its own, and a seed is created and played like a task. game's and bfcl's (one per game, one
per tool class) go through the real env service too; appworld's (one per app) through its real worker process
against the scripted stand-in of tests/test_appworld_env.py, and against real AppWorld where it is installed.
Each of these checks that its task splits are exactly what they were before the seeds existed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_service_fixture import RunningService, env_service
from test_appworld_env import code, fake_appworld, real_appworld  # noqa: F401  (fixtures of the appworld tests)

from agentevolver.client.env_client import EnvClient, EnvClientError, EnvClientSettings
from agentevolver.schema import ChatMessage, ToolCall, ToolFunction
from env_service.environments.appworld import AppWorldEnv
from env_service.environments.bfcl import BfclEnv, bfcl_available
from env_service.environments.codebox import CodeBoxEnv
from env_service.environments.exploration_seeds import EXPLORE_SPLIT, tool_seeds
from env_service.environments.game import GameEnv
from env_service.errors import UnknownTask

BFCL_SEEDS = ["explore-GorillaFileSystem", "explore-MathAPI", "explore-MessageAPI", "explore-TwitterAPI",
              "explore-TicketAPI", "explore-TradingBot", "explore-TravelAPI", "explore-VehicleControlAPI"]
APPWORLD_SEEDS = ["explore-amazon", "explore-file_system", "explore-gmail", "explore-phone", "explore-simple_note",
                  "explore-splitwise", "explore-spotify", "explore-todoist", "explore-venmo"]
NEEDS_BFCL = pytest.mark.skipif(not bfcl_available(), reason="bfcl_eval is not importable; install it with "
                                "scripts/install_extras.sh (see docs/env_bfcl.md)")

#: split -> (number of ids, digest of the ids) as the task splits listed them before the seeds were added.
BFCL_SPLITS = {"train": (100, "aaeb9c3168c98b32"), "val": (50, "a3093150974cf1ea"), "test": (50, "c2a82b415f95744b"),
               "test_miss_func": (50, "a46610b7b9e6573e"), "test_miss_param": (50, "e08c31f356009448")}
GAME_SPLITS = {"train": (64, "20a7c0a01348557d"), "val": (16, "c6f5a66d267bf216"), "test": (16, "b751ada4963f96a5"),
               "train/tictactoe": (64, "20a7c0a01348557d")}


def _listed(ids: list[str]) -> tuple[int, str]:
    return len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def _call(name: str, arguments: dict, call_id: str = "c0") -> ChatMessage:
    call = ToolCall(id=call_id, function=ToolFunction(name=name, arguments=json.dumps(arguments)))
    return ChatMessage(role="assistant", content="", tool_calls=[call])


def test_tool_seeds_are_one_per_tool_named_after_it() -> None:
    schemas = [{"type": "function", "function": {"name": "add", "description": "Add two numbers.\nMore."}},
               {"name": "bare"}, {"function": {"name": " "}}]
    seeds = tool_seeds(schemas)
    assert list(seeds) == ["explore-add", "explore-bare"]
    assert "`add` can do (Add two numbers.)" in seeds["explore-add"] and "(no description)" in seeds["explore-bare"]


def test_codebox_seeds_play_like_tasks_and_a_submission_is_not_graded() -> None:
    assert CodeBoxEnv.task_ids(EXPLORE_SPLIT) == ["explore-run_python", "explore-submit"]
    assert EXPLORE_SPLIT not in CodeBoxEnv.splits()  # a split of seeds, not of tasks
    env = CodeBoxEnv("explore-submit", "i-1", {})
    assert "`submit` can do" in env.reset()[-1].content
    call = ToolCall(id="c0", function=ToolFunction(name="submit", arguments=json.dumps({"code": "x = 1"})))
    outcome = env.step(ChatMessage(role="assistant", content="", tool_calls=[call]))
    assert outcome.is_terminated and outcome.reward == 0.0 and "exploration seed" in outcome.state[0].content
    assert env.evaluate(sparse=True) == 0.0 and env.info()["difficulty"] == "seed"


@pytest.fixture(scope="module")
def mcp_with_tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")
    folder = tmp_path_factory.mktemp("mcp_seeds")
    (folder / "tasks.jsonl").write_text(json.dumps({"id": "utc-day", "query": "What weekday is it in UTC?",
                                                    "answer": "day"}) + "\n")
    config = {"servers": [{"name": "time", "command": ["mcp-server-time", "--local-timezone", "Etc/UTC"]}],
              "tasks": "tasks.jsonl", "max_steps": 3}
    (folder / "servers.json").write_text(json.dumps(config))
    with env_service("mcp", tmp_path=folder, env={"AGENTEVOLVER_MCP_CONFIG": str(folder / "servers.json")}) as svc:
        yield svc


def test_mcp_lists_seeds_in_explore_beside_a_task_file_and_plays_one(mcp_with_tasks: RunningService) -> None:
    with EnvClient(EnvClientSettings(env_url=mcp_with_tasks.url, max_retries=0)) as env:
        assert env.get_env_profile("mcp", "train") == ["utc-day"]
        seeds = env.get_env_profile("mcp", EXPLORE_SPLIT)
        assert seeds and all(s.startswith("explore-") for s in seeds) and "explore-get_current_time" in seeds
        created = env.create("mcp", "explore-get_current_time")
        try:
            assert "`get_current_time` can do" in created.state[-1].content
        finally:
            env.release(created.info.instance_id)


# ---------------------------------------------------------------------------------------------- game and bfcl
@pytest.fixture(scope="module")
def game_and_bfcl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvClient]:
    """The real env service serving game and bfcl (bfcl's package imports without bfcl_eval; its tests skip)."""
    with env_service("game,bfcl", tmp_path=tmp_path_factory.mktemp("seeds")) as svc, \
            EnvClient(EnvClientSettings(env_url=svc.url, max_retries=0)) as env:
        yield env


def test_game_task_splits_are_unchanged_and_hold_no_seed() -> None:
    assert GameEnv.splits() == ["train", "val", "test"]
    for split, listed in GAME_SPLITS.items():
        assert _listed(GameEnv.task_ids(split)) == listed, split
    assert GameEnv.task_ids(EXPLORE_SPLIT) == ["explore-tictactoe"]


def test_game_seed_is_a_fresh_game_played_to_its_end_and_scored_zero(game_and_bfcl: EnvClient) -> None:
    env = game_and_bfcl
    assert env.get_env_profile("game", EXPLORE_SPLIT) == ["explore-tictactoe"]
    created = env.create("game", "explore-tictactoe")
    instance = created.info.instance_id
    try:
        assert "exploration seed, not a task" in created.state[0].content and "You are X" in created.state[-1].content
        game = env.get_info(instance)["game"]
        assert game["turn"] == "X" and game["summary"]["board"] == "." * 9  # no move played
        assert all("`tictactoe` is played" in game["openings"][seat][0]["content"] for seat in ("X", "O"))
        outcome = None
        for seat, move in (("X", 1), ("O", 4), ("X", 2), ("O", 5), ("X", 3)):  # X wins on the top row
            outcome = env.step(instance, ChatMessage(role="assistant", content=f"MOVE: {move}", name=seat))
            assert not outcome.info.get("fallback"), outcome.info
        assert outcome is not None and outcome.is_terminated and outcome.reward == 0.0
        assert "exploration seed" in outcome.info["note"] and outcome.info["game"]["scores"] == {"X": 1.0, "O": 0.0}
        assert env.evaluate(instance, sparse=True) == 0.0 and env.evaluate(instance, sparse=False) == 0.0
    finally:
        env.release(instance)
    with pytest.raises(EnvClientError) as err:
        env.create("game", "explore-chess")
    assert err.value.code == "unknown_task" and "explore-tictactoe" in str(err.value)


@NEEDS_BFCL
def test_bfcl_task_splits_are_unchanged_and_seeds_start_from_train_states() -> None:
    from env_service.environments.bfcl.data import TOOL_CLASSES, all_tasks
    from env_service.environments.bfcl.seeds import SEED_STATES

    assert BfclEnv.splits() == list(BFCL_SPLITS)
    for split, listed in BFCL_SPLITS.items():
        assert _listed(BfclEnv.task_ids(split)) == listed, split
    assert BfclEnv.task_ids(EXPLORE_SPLIT) == BFCL_SEEDS
    assert list(SEED_STATES) == list(TOOL_CLASSES)
    train = set(BfclEnv.task_ids("train"))
    for class_name, task_id in SEED_STATES.items():
        assert task_id in train and class_name in all_tasks()[task_id].involved_classes
    assert not set(BFCL_SEEDS) & set(all_tasks())  # seeds are no BFCL entry


@NEEDS_BFCL
@pytest.mark.parametrize("seed", BFCL_SEEDS)
def test_every_bfcl_seed_exposes_its_whole_class(seed: str) -> None:
    from env_service.environments.bfcl.data import func_docs

    env = BfclEnv(seed, "i", {})
    try:
        opening = env.reset()
        class_name = seed.removeprefix("explore-")
        assert [m.role for m in opening] == ["system", "user"] and f"`{class_name}`" in opening[1].content
        assert [t["function"]["name"] for t in env.info()["tools"]] == [d["name"] for d in func_docs(class_name)]
    finally:
        env.close()


@NEEDS_BFCL
def test_bfcl_seed_plays_a_call_on_its_state_and_scores_zero(game_and_bfcl: EnvClient) -> None:
    env = game_and_bfcl
    assert env.get_env_profile("bfcl", EXPLORE_SPLIT) == BFCL_SEEDS
    created = env.create("bfcl", "explore-GorillaFileSystem")
    instance = created.info.instance_id
    try:
        assert "Find out what the tools of `GorillaFileSystem`" in created.state[-1].content
        listed = env.step(instance, _call("ls", {"a": True}))
        assert listed.state[0].role == "tool" and "workspace" in listed.state[0].content  # multi_turn_base_1's /alex
        done = env.step(instance, ChatMessage(role="assistant", content="It lists, moves and reads files."))
        assert done.is_terminated and done.reward == 0.0 and "exploration seed" in done.info["note"]
        assert env.evaluate(instance, sparse=True) == 0.0 and env.evaluate(instance, sparse=False) == 0.0
        assert env.get_info(instance)["category"] == EXPLORE_SPLIT
    finally:
        env.release(instance)
    with pytest.raises(EnvClientError) as err:
        env.create("bfcl", "explore-ls")  # a function, not a tool class
    assert err.value.code == "unknown_task" and "explore-GorillaFileSystem" in str(err.value)


# ---------------------------------------------------------------------------------------------- appworld
def test_appworld_lists_one_seed_per_app_without_appworld() -> None:
    assert AppWorldEnv.task_ids(EXPLORE_SPLIT) == APPWORLD_SEEDS
    assert AppWorldEnv.splits() == ["train", "val", "test", "test_challenge"]
    with pytest.raises(UnknownTask) as err:
        AppWorldEnv("explore-api_docs", "i", {})
    assert err.value.field == "task_id" and "explore-spotify" in str(err.value)


def test_appworld_seed_plays_in_the_first_train_world_and_scores_zero(fake_appworld: Path) -> None:  # noqa: F811
    assert AppWorldEnv.task_ids("train") == ["t_1", "t_2"] and AppWorldEnv.task_ids("val") == ["t_3"]
    env = AppWorldEnv("explore-spotify", "i", {})
    try:
        opening = env.reset()
        assert "Find out what the app `spotify` can do" in opening[1].content and "Ada Lovelace" in opening[1].content
        assert "six times seven" not in opening[1].content  # the world's task is not the seed's
        assert env.info()["world_task_id"] == "t_1" and "exploration seed" in env.info()["note"]
        out = env.step(code("print(apis.supervisor.show_account_passwords())"))
        assert "spotify" in out.state[0].content and not out.is_terminated
        out = env.step(code("apis.supervisor.complete_task(answer=42)"))  # the world task's answer: still 0
        assert out.is_terminated and out.reward == 0.0 and "exploration seed" in out.info["note"]
        assert env.evaluate(sparse=True) == 0.0 and env.evaluate(sparse=False) == 0.0
    finally:
        env.close()


def test_real_appworld_seed(real_appworld: None) -> None:  # noqa: F811
    env = AppWorldEnv("explore-spotify", "real-seed", {})
    try:
        assert "`spotify`" in env.reset()[1].content
        out = env.step(code("print(apis.api_docs.show_api_descriptions(app_name='spotify'))"))
        assert "login" in out.state[0].content
        assert env.evaluate(sparse=True) == 0.0 and env.evaluate(sparse=False) == 0.0
    finally:
        env.close()
