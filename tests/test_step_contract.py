"""The step's stage contract: every stage is a function ``(state, trainer) -> state`` in its own module under
``agentevolver/verl/step/``, the step is the list of them, docs/training.md shows that list, and the state owns
the episode view of its rows."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import torch
from verl import DataProto

from agentevolver.verl.step.state import Stage, StepState, run_stages
from agentevolver.verl.step.trainer import STEP, AgentEvolverTrainer

DOCS = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def test_every_stage_is_a_function_of_the_state_and_the_trainer_in_a_step_module() -> None:
    names = [stage.name for stage in STEP]
    assert len(names) == len(set(names)), "each stage has its own timer name"
    assert tuple(names) == AgentEvolverTrainer.STAGES
    for stage in STEP:
        signature = inspect.signature(stage.run)
        assert list(signature.parameters) == ["state", "trainer"], stage.name
        assert signature.return_annotation == "StepState", stage.name
        module = stage.run.__module__
        assert module.startswith("agentevolver.verl.step.") and module != "agentevolver.verl.step.trainer", (
            f"stage {stage.name} lives in {module}, not in a stage module of its own")


def test_the_docs_table_is_the_step() -> None:
    text = DOCS.read_text()
    table = text[text.index("| # | stage | module |"):]
    table = table[: table.index("\n\n")]
    rows = [line.split("|") for line in table.splitlines()[2:]]
    documented = [re.findall(r"`([a-z_]+)`", row[2])[-1] for row in rows]
    modules = [row[3].strip().strip("`") for row in rows]
    assert documented == list(AgentEvolverTrainer.STAGES)
    assert modules == [stage.run.__module__.rsplit(".", 1)[1] for stage in STEP]


def _rows(count: int) -> DataProto:
    return DataProto.from_dict(tensors={"responses": torch.arange(count * 2).reshape(count, 2)},
                               non_tensors={"uid": np.array([f"g{i}" for i in range(count)], dtype=object)})


def test_the_state_derives_its_episode_view_again_when_its_rows_are_replaced() -> None:
    state = StepState(step=1, epoch=0, task_rows={})
    state.batch = _rows(3)
    assert state.episodes is state.batch  # no added rows: the episodes are the rows
    state.episode_count = 2
    state.batch = _rows(5)  # e.g. rows for earlier samples appended
    assert len(state.episodes) == 2 and state.episodes.batch["responses"].tolist() == [[0, 1], [2, 3]]
    view = state.episodes
    assert state.episodes is view  # derived once, not per read
    state.batch = _rows(5)
    assert state.episodes is not view


def test_stages_run_in_order_each_timed_and_hand_the_state_on() -> None:
    seen: list[str] = []

    def first(state: StepState, trainer: object) -> StepState:
        seen.append("first")
        state.metrics["a"] = 1.0
        return state

    def second(state: StepState, trainer: object) -> StepState:
        seen.append("second")
        state.metrics["b"] = state.metrics["a"] + 1
        return StepState(step=state.step, epoch=state.epoch, task_rows={}, metrics=state.metrics,
                         timings=state.timings)

    out = run_stages((Stage("first", first), Stage("second", second)),
                     StepState(step=3, epoch=0, task_rows={}), trainer=None)  # type: ignore[arg-type]
    assert seen == ["first", "second"] and out.metrics == {"a": 1.0, "b": 2.0}
    assert set(out.timings) == {"first", "second"} and all(t >= 0 for t in out.timings.values())
