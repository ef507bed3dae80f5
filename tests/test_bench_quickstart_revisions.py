"""bench/quickstart_revisions.py without its two quickstarts (minutes each): reading a run's metrics, the
table and its ratio, and the error for a revision git does not know."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("quickstart_revisions", REPO_ROOT / "bench" / "quickstart_revisions.py")
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
sys.modules["quickstart_revisions"] = bench
_SPEC.loader.exec_module(bench)


def write_metrics(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_a_runs_curve_and_step_times_are_read_and_compared(tmp_path: Path) -> None:
    before = bench.read_run("a" * 40, write_metrics(tmp_path / "b.jsonl", [
        {"step": 0, "val-core/calc/acc/mean@1": 0.633},
        {"step": 1, "timing_s/step": 60.0, "val-core/calc/reward/mean@1": 9.0},
        {"step": 2, "timing_s/step": 70.0, "val-core/calc/acc/mean@1": 0.8}]), wall_s=400.0, exit_code=0)
    after = bench.read_run("b" * 40, write_metrics(tmp_path / "a.jsonl", [
        {"step": 0, "val-core/calc/acc/mean@1": 0.633},
        {"step": 1, "timing_s/step": 66.0},
        {"step": 2, "timing_s/step": 77.0, "val-core/calc/acc/mean@1": 0.8}]), wall_s=420.0, exit_code=0)
    assert before.validation == {0: 0.633, 2: 0.8} and before.step_s == [60.0, 70.0]
    text = bench.table([before], [after])
    assert "| aaaaaaaaaaaa | 63.3% -> 80.0% | 65.0 | 60 / 70 | 400 | 0 |" in text
    assert "neither validate nor save, after / before: **1.10x** (2 and 2 steps)" in text


def test_seconds_per_token_and_the_stages_are_compared(tmp_path: Path) -> None:
    """The samples (and with them the tokens a step trains) differ run to run, so the step time is also given per
    1,000 tokens, and each stage's median beside the other revision's (a stage only one revision has shows -)."""
    before = bench.read_run("a" * 40, write_metrics(tmp_path / "b.jsonl", [
        {"step": 1, "timing_s/step": 60.0, "perf/total_num_tokens": 6000, "timing_s/gen": 30.0},
        {"step": 2, "timing_s/step": 40.0, "perf/total_num_tokens": 4000, "timing_s/gen": 20.0}]), 1.0, 0)
    after = bench.read_run("b" * 40, write_metrics(tmp_path / "a.jsonl", [
        {"step": 1, "timing_s/step": 90.0, "perf/total_num_tokens": 9000, "timing_s/gen": 45.0,
         "timing_s/judge": 0.5, "timing_s/testing": 0.0},  # a stage that did not run: 0 s
        # a step that validates: left out of the ratios (since issue 26 the step timer covers validation)
        {"step": 2, "timing_s/step": 190.0, "perf/total_num_tokens": 9000, "timing_s/testing": 100.0}]), 1.0, 0)
    assert before.tokens == [6000.0, 4000.0] and before.stages == {"gen": [30.0, 20.0]}
    assert after.extra_work == [False, True]
    text = bench.table([before], [after])
    assert "after / before: **1.80x** (1 and 2 steps)" in text  # slower steps ...
    assert "after / before: **1.00x** (10.00 and 10.00 s)" in text  # ... that trained more tokens at the same rate
    assert "| gen | 25.0 | 45.0 |" in text and "| judge | - | 0.5 |" in text


def test_a_run_that_wrote_no_metrics_shows_dashes(tmp_path: Path) -> None:
    run = bench.read_run("c" * 40, tmp_path / "missing.jsonl", wall_s=5.0, exit_code=1)
    assert "| cccccccccccc | - | - | - | 5 | 1 |" in bench.table([run], [])


def test_an_unknown_revision_is_named() -> None:
    with pytest.raises(SystemExit, match="git does not know the revision 'no-such-revision'"):
        bench.resolve("no-such-revision")
