"""The trainer's logger backends (``table``, ``jsonl``), the TensorBoard folder, and the guarded patch that
makes verl's ``fit()`` build them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.verl import patches as verl_patches
from agentevolver.verl.tracking import HEADER_EVERY, RunTracking, StepTable, logger_names, read_metrics

STEP_METRICS = {"critic/score/mean": 0.5, "episode/success_rate": 0.25, "response_length/mean": 41.2,
                "num_turns/mean": 2.0, "actor/pg_loss": -0.0123, "actor/ppo_kl": 0.0004,
                "actor/grad_norm": 1.5, "timing_s/gen": 12.3, "timing_s/update_actor": 30.0,
                "timing_s/step": 44.0, "episode/env_errors": 1.0}


def _config(run_dir: Path) -> dict:
    return {"trainer": {"default_local_dir": str(run_dir), "total_training_steps": 3}}


def test_jsonl_backend_appends_flat_steps_and_tensorboard_goes_to_the_run_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    run = tmp_path / "run"
    tracking = RunTracking("p", "e", ["jsonl", "tensorboard"], _config(run))
    tracking.log({"val-core/calc/acc/mean@1": 0.5}, step=0)
    tracking.log(STEP_METRICS, step=1)
    tracking.log({"note": "text is skipped", "bad": float("nan")}, step=1, backend=["jsonl"])
    tracking.finish()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 0, "val-core/calc/acc/mean@1": 0.5}
    assert lines[1]["step"] == 1 and lines[1]["actor/pg_loss"] == -0.0123
    assert lines[2] == {"step": 1, "bad": None}  # text skipped; JSON has no NaN
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    # a resumed run appends; the reader keeps the last value of a step and skips a torn line
    resumed = RunTracking("p", "e", ["jsonl"], _config(run))
    resumed.log({"actor/pg_loss": 0.5}, step=1)
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2, "actor/pg')
    steps = read_metrics(run / "metrics.jsonl")
    assert sorted(steps) == [0, 1]
    assert steps[1]["actor/pg_loss"] == 0.5 and steps[1]["timing_s/step"] == 44.0


def test_step_table_rows_header_and_validation_line() -> None:
    out = io.StringIO()
    table = StepTable(total_steps=3, console=Console(file=out, width=160))
    table.log({"val-core/calc/acc/mean@1": 0.5}, step=0)
    table.log(STEP_METRICS, step=1)
    table.log({"actor/pg_loss": 0.1, "timing_s/step": 9.0}, step=2)
    lines = [line.split() for line in out.getvalue().splitlines() if line.strip()]
    assert lines[0][:4] == ["validation", "@", "step", "0:"] and lines[0][-1] == "0.500"
    assert lines[1][:3] == ["step", "reward", "success"]
    assert lines[2] == ["1/3", "0.500", "25%", "41", "2.0", "-0.0123", "0.0004", "1.500", "12", "30", "44", "1"]
    assert lines[3][0] == "2/3" and lines[3].count("-") == 9  # missing numbers shown as "-"
    assert len(lines) == 4  # no second header before HEADER_EVERY rows
    assert HEADER_EVERY > 2


def test_jsonl_without_a_run_dir_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="default_local_dir"):
        RunTracking("p", "e", ["jsonl"], {"trainer": {}})


def test_logger_names_takes_one_name_or_a_list() -> None:
    assert logger_names("table") == ["table"]
    assert logger_names(["console", "jsonl"]) == ["console", "jsonl"]
    assert logger_names(None) == []


def test_unknown_logger_is_rejected_before_the_run(tmp_path: Path) -> None:
    cfg = compose_config(overrides=["trainer.logger=[table,tensorbord]",
                                    f"trainer.default_local_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="tensorbord"):
        prepare_config(cfg)


def test_the_trainer_seams_guard_names_a_changed_verl_method() -> None:
    """The training loop builds RunTracking itself (no patch of verl's Tracking); what it relies on in verl's
    trainer is guarded instead: a seam with other parameters, or a validation that no longer builds its rows
    through _get_gen_batch, stops the run naming it."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    verl_patches.check_trainer_seams(RayPPOTrainer)

    class Changed(RayPPOTrainer):
        def _update_actor(self, batch, metrics):  # another signature
            return batch

    with pytest.raises(verl_patches.VerlChangedError, match="_update_actor now takes"):
        verl_patches.check_trainer_seams(Changed)

    class Validates(RayPPOTrainer):
        def _validate(self, merged=False):
            return {}

    with pytest.raises(verl_patches.VerlChangedError, match="no longer contains"):
        verl_patches.check_trainer_seams(Validates)
