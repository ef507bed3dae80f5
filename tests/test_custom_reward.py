"""verl's ``reward.custom_reward_function`` scores agent episodes (agentevolver.verl.custom_reward).

Unit tests call :func:`apply_custom_reward` on a finished episode with a reward file written here (verl's
contract: ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``). The
end-to-end test, two tiny-test GRPO steps through ``python -m agentevolver.main_ppo`` scored by this file's
``compute_score``, is ``test_custom_reward_scores_a_training_run`` in tests/test_main_ppo.py: its run also
proves Self-Attributing and verl's own forward (one start-up for three tests).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from agentevolver.errors import ConfigError
from agentevolver.module.agent_flow.episode import EpisodeResult, EpisodeSpec
from agentevolver.schema import Reward, Task, TaskObjective
from agentevolver.schema.sample import Sample
from agentevolver.verl.custom_reward import (
    RewardFunctionError,
    apply_custom_reward,
    check_custom_reward,
    load_custom_reward,
)

REWARD_FILE = '''
import json

def compute_score(data_source, solution_str, ground_truth, extra_info, log_path=None, bonus=0.0):
    if log_path:
        with open(log_path, "a") as log:
            log.write(json.dumps({"data_source": data_source, "solution_str": solution_str,
                                  "ground_truth": ground_truth,
                                  "extra_info": {k: v for k, v in extra_info.items() if k != "messages"},
                                  "n_messages": len(extra_info["messages"])}) + "\\n")
    return 0.25 + 0.5 * extra_info["env_score"] + bonus

async def async_score(data_source, solution_str, ground_truth, extra_info):
    return {"score": 2.0, "length": len(solution_str), "note": "text is not a metric"}

def not_a_number(data_source, solution_str, ground_truth, extra_info):
    return "high"

def nan_score(data_source, solution_str, ground_truth, extra_info):
    return float("nan")

def boom(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("ground_truth")

def two_args(solution_str, ground_truth):
    return 1.0
'''


class _Tokenizer:
    """Decodes ids as letters (a=0, b=1, ...); special tokens (id >= 100) vanish when skipped."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("<s>" if i >= 100 else chr(ord("a") + i) for i in ids if not (skip_special_tokens and i >= 100))


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _config(path: Path | None, name: str = "compute_score", **reward_kwargs: Any) -> Any:
    section: dict[str, Any] = {"path": str(path) if path else None, "name": name}
    if reward_kwargs:
        section["reward_kwargs"] = reward_kwargs
    return OmegaConf.create({"reward": {"custom_reward_function": section}})


def _episode(outcome: float = 1.0) -> tuple[EpisodeResult, EpisodeSpec]:
    task = Task(task_id="t1~syn", env_type="calc", query="2+2?", evaluator="llm", ground_truth="4")
    spec = EpisodeSpec.for_objective(TaskObjective(task=task, seed_task_id="t1"), group_id="g", rollout_id=3)
    sample = Sample(task_id="t1", group_id="g", rollout_id=3, prompt_ids=[1, 2], response_ids=[0, 1, 100, 2],
                    response_mask=[1, 1, 0, 1], step_ids=[0, 0, -1, 1])
    result = EpisodeResult(task_id="t1", env_type="calc", group_id="g", rollout_id=3, termination="finished",
                           num_turns=2, reward=Reward(outcome=outcome, success_rate=1.0, description="env says 1"),
                           samples=[sample], messages=[{"role": "user", "content": "2+2?"}],
                           metrics={"episode/env_errors": 0.0})
    return result, spec


def _apply(config: Any, row: dict[str, Any] | None = None, outcome: float = 1.0) -> EpisodeResult:
    result, spec = _episode(outcome)
    return asyncio.run(apply_custom_reward(result, spec, row or {}, config, _Tokenizer()))


def test_no_function_configured_leaves_the_episode_alone() -> None:
    result, spec = _episode()
    assert asyncio.run(apply_custom_reward(result, spec, {}, _config(None), _Tokenizer())) is result
    assert asyncio.run(apply_custom_reward(result, spec, {}, OmegaConf.create({}), _Tokenizer())) is result
    assert check_custom_reward(_config(None)) is None


def test_the_function_replaces_the_outcome_and_sees_the_episode(reward_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    scored = _apply(_config(reward_file, log_path=str(log), bonus=0.125), outcome=1.0)
    assert scored.reward.outcome == 0.25 + 0.5 * 1.0 + 0.125
    assert scored.reward.success_rate == 1.0  # success stays the environment's
    assert scored.reward.description.startswith("compute_score: 0.875 (before: 1; env says 1")
    assert scored.metrics["reward/before_custom"] == 1.0 and scored.metrics["episode/env_errors"] == 0.0
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert call["data_source"] == "calc"
    assert call["solution_str"] == "abc"  # special token skipped, as verl's reward manager decodes
    assert call["ground_truth"] == "4"  # the task's reference answer
    info = call["extra_info"]
    assert info["task_id"] == "t1" and info["query"] == "2+2?" and info["rollout_id"] == 3
    assert info["env_score"] == 1.0 and info["termination"] == "finished" and info["num_turns"] == 2
    assert info["evaluator"] == "llm" and call["n_messages"] == 1


def test_row_ground_truth_and_extra_info_win(reward_file: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    row = {"reward_model": {"ground_truth": "four"}, "extra_info": {"split": "train", "task_id": "overwritten"}}
    _apply(_config(reward_file, log_path=str(log)), row=row)
    call = json.loads(log.read_text())
    assert call["ground_truth"] == "four"
    assert call["extra_info"]["split"] == "train" and call["extra_info"]["task_id"] == "t1"


def test_async_function_with_a_dict_result(reward_file: Path) -> None:
    scored = _apply(_config(reward_file, name="async_score"))
    assert scored.reward.outcome == 2.0
    assert scored.metrics["reward/custom/length"] == 3.0
    assert "reward/custom/note" not in scored.metrics


@pytest.mark.parametrize(("name", "message"), [
    ("not_a_number", "returned str; expected a number"),
    ("nan_score", "a score must be finite"),
    ("boom", "raised KeyError"),
])
def test_a_broken_function_stops_the_run_naming_it(reward_file: Path, name: str, message: str) -> None:
    with pytest.raises(RewardFunctionError, match=message) as err:
        _apply(_config(reward_file, name=name))
    assert name in str(err.value) and str(reward_file) in str(err.value)


def test_start_up_check_names_what_is_wrong(reward_file: Path, tmp_path: Path) -> None:
    assert check_custom_reward(_config(reward_file, log_path="x", bonus=1.0)) is not None
    with pytest.raises(ConfigError, match="no such file"):
        check_custom_reward(_config(tmp_path / "missing.py"))
    with pytest.raises(ConfigError, match="cannot load 'nope'"):
        check_custom_reward(_config(reward_file, name="nope"))
    with pytest.raises(ConfigError, match="must accept the keyword arguments"):
        check_custom_reward(_config(reward_file, name="two_args"))
    with pytest.raises(ConfigError, match="must accept the keyword arguments"):  # unknown reward_kwargs
        check_custom_reward(_config(reward_file, typo=1))


def test_loaded_once_per_process(reward_file: Path) -> None:
    config = _config(reward_file, bonus=0.5)
    assert load_custom_reward(config) is load_custom_reward(_config(reward_file, bonus=0.5))
    assert load_custom_reward(config) is not load_custom_reward(_config(reward_file, bonus=0.25))

