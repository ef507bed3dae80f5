"""Issue 43, part 2: a measurement that can see an effect.

* calc's ``eval`` split: 200 tasks, 40 per level, drawn like val, disjoint from every other split; the existing
  splits are byte-identical to what they were (pinned digests).
* Per-task records (verl's validation dump, read by :mod:`agentevolver.experiments.records`): the McNemar count
  of two arms pooled over seeds, against a hand-computed answer; the report CLI on an ablation folder shows it
  with the per-level table and avg@4 / best@4.
* Batch invariance: with ``batch_invariant_greedy``, a bf16 generator's greedy tokens and log-probs are the
  same bits whether the request ran alone or amid sampled and greedy company, continuous batching and
  multi-turn conversations included; and two ``trainer.val_only`` validations of one checkpoint through
  ``python -m agentevolver.main_ppo``, batched differently, agree task by task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import json
import math
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from test_experiments import _fake_run, write_ablation
from training_fixture import run_training, training_command, training_timeout

from agentevolver.errors import ConfigError
from agentevolver.experiments.cli import main
from agentevolver.experiments.plan import plan_ablation
from agentevolver.experiments.records import (
    COMPACT_FILE,
    VALIDATION_DIR,
    TaskRecord,
    level_of,
    mcnemar,
    per_level,
    read_records,
    solved_tasks,
    validation_steps,
)
from agentevolver.experiments.spec import load_spec, parse_arms
from agentevolver.experiments.state import STATE_FILE, RunState
from env_service.environments.calc.tasks import LEVELS, SPLITS, get_task, split_task_ids

# -- the eval split -----------------------------------------------------------------------------------------

#: sha256 of every task (all fields, sorted keys) of each original split, taken before ``eval`` was added.
PINNED = {
    "train": "d16b2b83b299464001399d30635ff52a6fe3ad2e391ee7a1be86bd7280c59f04",
    "val": "fb464aebd6d5adc2850efb79777004be4da1d58fcaacdb08b9a537ad87b481c6",
    "test": "8f133aed9bb514252054f026703dda098d53b60fcb848e74a4063d2d7c2b304c",
}


def _digest(split: str) -> str:
    tasks = [dataclasses.asdict(get_task(task_id)) for task_id in split_task_ids(split)]
    return hashlib.sha256(json.dumps(tasks, sort_keys=True).encode()).hexdigest()


def test_adding_eval_left_every_existing_split_byte_identical() -> None:
    assert {split: _digest(split) for split in PINNED} == PINNED


def test_eval_has_200_tasks_over_the_five_levels_disjoint_from_the_other_splits() -> None:
    assert "eval" in SPLITS
    ids = split_task_ids("eval")
    tasks = [get_task(task_id) for task_id in ids]
    assert Counter(task.level for task in tasks) == {level: 40 for level in LEVELS}
    assert ids[0] == "eval-single-000" and ids[-1] == "eval-convert-039"
    assert [level_of(task_id) for task_id in ids] == [task.level for task in tasks]
    problem = lambda task: (task.level, json.dumps(task.solution, sort_keys=True))  # noqa: E731
    mine = {problem(task) for task in tasks}
    assert len(mine) == len({task.query for task in tasks}) == 200
    for other in ("train", "val", "test"):
        theirs = [get_task(task_id) for task_id in split_task_ids(other)]
        assert not mine & {problem(task) for task in theirs}, other
        assert not {task.query for task in tasks} & {task.query for task in theirs}, other
    assert split_task_ids("eval/word") == [t for t in ids if t.startswith("eval-word-")]


# -- records and the McNemar count --------------------------------------------------------------------------

def _records(solved: dict[str, bool], step: int = 2) -> list[TaskRecord]:
    return [TaskRecord(task_id=task, level=level_of(task), step=step, score=float(ok), success=float(ok))
            for task, ok in solved.items()]


def test_mcnemar_pools_discordant_tasks_over_seeds_with_the_exact_p_value() -> None:
    # seed 0: the arm alone solves a, b, c; the baseline alone d; both e; neither f
    # seed 1: the arm alone solves a, b, c; both d, e; neither f (and g only the arm validated: left out)
    seed0 = ({"a": True, "b": True, "c": True, "d": False, "e": True, "f": False},
             {"a": False, "b": False, "c": False, "d": True, "e": True, "f": False})
    seed1 = ({"a": True, "b": True, "c": True, "d": True, "e": True, "f": False, "g": True},
             {"a": False, "b": False, "c": False, "d": True, "e": True, "f": False})
    test = mcnemar("sa", "grpo", {0: seed0, 1: seed1})
    assert (test.only_arm, test.only_baseline, test.both, test.neither, test.pairs) == (6, 1, 3, 2, 12)
    assert test.seeds == (0, 1)
    # exact McNemar: two-sided binomial on 7 discordant pairs, 1 the other way: 2 * (C(7,0) + C(7,1)) / 2^7
    assert test.p_value == pytest.approx(2 * (math.comb(7, 0) + math.comb(7, 1)) / 2**7)
    assert test.p_value == pytest.approx(0.125)
    assert mcnemar("a", "b", {0: ({"x": True}, {"x": True})}).p_value == 1.0  # no discordant pair


def test_a_task_is_solved_when_at_least_half_its_samples_succeed() -> None:
    records = [TaskRecord("eval-word-000", "word", 2, 1.0, s) for s in (1.0, 0.0, 0.0, 1.0)]
    records += [TaskRecord("eval-word-001", "word", 2, 1.0, s) for s in (1.0, 0.0, 0.0, 0.0)]
    records += [TaskRecord("eval-chain-000", "chain", 2, 0.5, 0.5)]  # partial success is not solved
    assert solved_tasks(records) == {"eval-word-000": True, "eval-word-001": False, "eval-chain-000": False}
    assert per_level(records) == {"word": 0.375, "chain": 0.5, "all": pytest.approx(3.5 / 9)}
    assert level_of("val-single-017") == "single" and level_of("task-1") is None and level_of("x") is None


def _write_dump(run_dir: Path, step: int, solved: dict[str, bool]) -> None:
    """Lines as verl's ``_dump_generations`` writes them, with the agent loop's reward_extra_info."""
    folder = run_dir / VALIDATION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"input": "q", "output": "a", "gts": None, "score": float(ok), "step": step,
                         "reward": float(ok), "acc": float(ok), "outcome": float(ok), "experience": 0.0,
                         "task_id": task}) for task, ok in solved.items()]
    (folder / f"{step}.jsonl").write_text("\n".join(lines) + "\n")


def test_a_dump_without_task_ids_is_an_error_naming_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / VALIDATION_DIR).mkdir()
    (tmp_path / VALIDATION_DIR / "2.jsonl").write_text(json.dumps({"score": 1.0, "acc": 1.0, "step": 2}) + "\n")
    with pytest.raises(ConfigError, match=r"2\.jsonl:1: not a validation record .*task_id"):
        read_records(tmp_path, 2)
    assert read_records(tmp_path, 4) == []  # no validation at that step: no records


def test_report_cli_shows_per_level_scores_and_the_mcnemar_count(tmp_path: Path) -> None:
    spec = load_spec(write_ablation(tmp_path, {"baseline": "grpo", "arms": {"grpo": {}, "sa": {}}}))
    plan = plan_ablation(spec, tmp_path / "ablation.yaml", parse_arms(spec, None), [0, 1], tmp_path / "out", [])
    tasks = [f"eval-{level}-{index:03d}" for level in ("word", "chain") for index in range(4)]
    # grpo solves the chain tasks; sa the chain tasks and, per seed, the first 3 (seed 0) or 2 (seed 1) word
    # tasks, but misses chain-003 at seed 1: sa only 5, grpo only 1, both 7, neither 3 -> p = 2 * 7/64
    solved = {("grpo", 0): {t: "chain" in t for t in tasks}, ("grpo", 1): {t: "chain" in t for t in tasks},
              ("sa", 0): {t: "chain" in t or t in {"eval-word-000", "eval-word-001", "eval-word-002"} for t in tasks},
              ("sa", 1): {t: ("chain" in t and t != "eval-chain-003") or t in {"eval-word-000", "eval-word-001"}
                          for t in tasks}}
    for run in plan.runs:
        run.total_steps = 2
        _fake_run(run.run_dir, {0: (0.3, 0.5), 2: (0.5, 0.75)}, 60)
        _write_dump(run.run_dir, 0, {t: False for t in tasks})
        _write_dump(run.run_dir, 2, solved[(run.arm, run.seed)])
    (plan.out / "ablation.json").parent.mkdir(parents=True, exist_ok=True)
    (plan.out / "ablation.json").write_text(json.dumps({**plan.to_json(), "command_line": "python -m x"}))

    assert main(["report", str(plan.out)], console=Console(file=io.StringIO())) == 0
    readme = (plan.out / "README.md").read_text()
    assert "## Final validation per task" in readme
    assert "| arm | seeds | word (%) | chain (%) | all (%) |" in readme
    assert "| grpo | 2 | 0.0 ± 0.0 | 100.0 ± 0.0 | 50.0 ± 0.0 |" in readme
    # sa word: 75, 50 -> 62.5 ± 17.7; chain: 100, 75 -> 87.5 ± 17.7; all: 87.5, 62.5 -> 75.0 ± 17.7
    assert "| sa | 2 | 62.5 ± 17.7 | 87.5 ± 17.7 | 75.0 ± 17.7 |" in readme
    assert "| sa | grpo | 0, 1 | 16 | 5 | 1 | 7 | 3 | 0.219 |" in readme  # 2 * (1 + 6) / 64 = 0.21875
    # beside it, the seed-level paired difference and the secondary metric avg@4 / best@4
    assert "| sa | grpo | 2 | +0.0 |" in readme and "avg@4 / best@4 after" in readme and "50.0 / 75.0" in readme
    summary = json.loads((plan.out / "summary.json").read_text())
    sa = next(arm for arm in summary["arms"] if arm["arm"] == "sa")
    assert sa["paired_tasks"] == {"baseline": "grpo", "seeds": [0, 1], "pairs": 16, "only_arm": 5,
                                  "only_baseline": 1, "both": 7, "neither": 3, "mcnemar_p": pytest.approx(0.21875)}
    assert summary["runs"][0]["levels_after"] == {"word": 0.0, "chain": 1.0, "all": 0.5}

    # the dumps (megabytes, untracked) gone, as in a later checkout: the tracked condensed file reports the same
    for run in plan.runs:
        compact = run.run_dir / COMPACT_FILE
        assert len(compact.read_text().splitlines()) == 2 * len(tasks)  # both validations, a line per task
        shutil.rmtree(run.run_dir / VALIDATION_DIR)
        assert validation_steps(run.run_dir) == [0, 2] and len(read_records(run.run_dir, 2)) == len(tasks)
    assert main(["report", str(plan.out)], console=Console(file=io.StringIO())) == 0
    undated = lambda text: re.sub(r"Updated \S+\.", "", text)  # noqa: E731
    assert undated((plan.out / "README.md").read_text()) == undated(readme)


def test_runs_write_their_validation_dump_and_older_run_folders_still_resume(tmp_path: Path) -> None:
    spec = load_spec(write_ablation(tmp_path, {"arms": {"a": {}}}))
    (run,) = plan_ablation(spec, tmp_path / "ablation.yaml", parse_arms(spec, None), [0], tmp_path / "out", []).runs
    assert f"trainer.validation_data_dir={run.run_dir / VALIDATION_DIR}" in run.overrides
    # a run folder from before the runner set the key is the same command ...
    RunState(run).save(status="running")
    stored = json.loads((run.run_dir / STATE_FILE).read_text())
    stored["overrides"] = [o for o in stored["overrides"] if not o.startswith("trainer.validation_data_dir=")]
    (run.run_dir / STATE_FILE).write_text(json.dumps(stored))
    RunState(run).check_same_command()
    # ... but one that set it elsewhere is not
    stored["overrides"].append("trainer.validation_data_dir=/elsewhere")
    (run.run_dir / STATE_FILE).write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match="was made with another command"):
        RunState(run).check_same_command()


# -- batch invariance -----------------------------------------------------------------------------------------

GREEDY = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 10}
SAMPLED = {"temperature": 0.9, "top_p": 0.95, "logprobs": True, "max_tokens": 10}
QUESTIONS = ["Hi", "What is 2+2?", "Name three colours.", "Why is the sky blue? Answer briefly.",
             "List the first five prime numbers, separated by commas.", "ok"]


@pytest.fixture(scope="module")
def bf16_model() -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from agentevolver.models import resolve_model_path

    path = resolve_model_path("tiny-test")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    from agentevolver.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-test"))
    return [tokenizer.encode(question, add_special_tokens=False) for question in QUESTIONS]


async def _conversations(gen: Any, prompts: list[list[int]], *, crowd: bool) -> list[tuple[list[int], list[float]]]:
    """Two greedy turns per prompt (the second continues the first: the turn cache's case), concurrently with
    sampled requests when ``crowd``, else one request at a time; the greedy turns' tokens and log-probs."""
    async def conversation(index: int, prompt: list[int]) -> list[tuple[list[int], list[float]]]:
        first = await gen.generate(f"g{index}a", prompt_ids=prompt, sampling_params=GREEDY)
        second_prompt = [*prompt, *first.token_ids, *prompt[:3]]
        second = await gen.generate(f"g{index}b", prompt_ids=second_prompt, sampling_params=GREEDY)
        return [(first.token_ids, first.log_probs), (second.token_ids, second.log_probs)]

    if not crowd:
        return [turn for i, p in enumerate(prompts) for turn in await conversation(i, p)]
    noise = [gen.generate(f"s{i}", prompt_ids=p, sampling_params=SAMPLED) for i, p in enumerate(prompts * 2)]
    results = await asyncio.gather(*(conversation(i, p) for i, p in enumerate(prompts)), *noise)
    return [turn for conversation_turns in results[:len(prompts)] for turn in conversation_turns]


@pytest.mark.parametrize("continuous", [False, True])
async def test_greedy_requests_give_the_same_bits_alone_or_in_company(bf16_model: Any, prompts: list[list[int]],
                                                                      continuous: bool) -> None:
    from agentevolver.backends.cpu import HFGenerator

    async def run(crowd: bool) -> tuple[list[tuple[list[int], list[float]]], dict[str, float]]:
        gen = HFGenerator(bf16_model, [2], pad_token_id=0, seed=0, batch_wait_s=0.05 if crowd else 0.0,
                          continuous_batching=continuous, batch_invariant_greedy=True)
        try:
            return await _conversations(gen, prompts, crowd=crowd), dict(gen.stats)
        finally:
            await gen.aclose()

    alone, _ = await run(crowd=False)
    crowded, stats = await run(crowd=True)
    assert stats["max_rows"] > 1  # the sampled requests did batch together
    assert crowded == alone  # tokens and log-probs, bit for bit
    assert stats["turn_cached_tokens"] == 0  # a greedy second turn prefilled whole, not from the turn cache


# -- two validations of one checkpoint, through the real entry point --------------------------------------------

@pytest.fixture(scope="module")
def calc_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from env_service_fixture import env_service

    with env_service("calc", tmp_path=tmp_path_factory.mktemp("paired_validation")) as running:
        yield running.url


#: The calc replacements of training_command's lottery settings.
_REPLACED = ("env_service.env_type=lottery", "env_service.val_split=val", "trainer.val_before_train=false",
             "env_service.create_params={}", "data.max_prompt_length=256")


def _validate_only(service: str, run_dir: Path, *batching: str) -> list[dict[str, Any]]:
    """A ``trainer.val_only`` run of tiny-test (bf16 rollout) on 25 eval tasks spread over the levels: verl's
    validation dump, line by line, checked to read as records."""
    command = [arg for arg in training_command(
        service, run_dir, "env_service.env_type=calc", "env_service.val_split=eval", "data.val_max_samples=25",
        "env_service.create_params={demos:1}", "data.max_prompt_length=1536",
        "trainer.val_before_train=true", "trainer.val_only=true", "actor_rollout_ref.rollout.dtype=bf16",
        "actor_rollout_ref.rollout.val_kwargs.n=1", "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        "agent_flow.max_steps=2", f"trainer.validation_data_dir={run_dir / 'run' / VALIDATION_DIR}",
        "+actor_rollout_ref.rollout.engine_kwargs.hf.batch_invariant_greedy=true", *batching)
        if arg not in _REPLACED]
    run_dir.mkdir(parents=True)
    done = run_training(command, run_dir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    records = read_records(run_dir / "run", 0)
    assert len(records) == 25 and {r.level for r in records} == set(LEVELS)
    dump = run_dir / "run" / VALIDATION_DIR / "0.jsonl"
    return [json.loads(line) for line in dump.read_text().splitlines()]


@training_timeout
def test_two_validations_of_one_checkpoint_agree_task_by_task(calc_service: str, tmp_path: Path) -> None:
    # closed batches of up to 16 against continuous batching in batches of 3 (``++``: the preset may set either)
    first = _validate_only(calc_service, tmp_path / "a", "+actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size=16",
                           "+actor_rollout_ref.rollout.engine_kwargs.hf.batch_wait_s=0.05",
                           "++actor_rollout_ref.rollout.engine_kwargs.hf.continuous_batching=false")
    second = _validate_only(calc_service, tmp_path / "b", "+actor_rollout_ref.rollout.engine_kwargs.hf.max_batch_size=3",
                            "++actor_rollout_ref.rollout.engine_kwargs.hf.continuous_batching=true")
    # every task: the same prompt, the same response text, the same score, however the requests were batched.
    # (tiny-test's greedy responses are alike whatever the task; the bit-level evidence is the generator test
    # above, whose requests without batch_invariant_greedy give other log-probs in bf16.)
    key = lambda lines: sorted((r["task_id"], r["input"], r["output"], r["score"], r["acc"]) for r in lines)  # noqa: E731
    assert key(first) == key(second)
    assert len({r["task_id"] for r in first}) == len({r["input"] for r in first}) == 25  # one record per task
