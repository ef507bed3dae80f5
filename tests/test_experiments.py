"""The ablation runner (``python -m agentevolver.experiments ablation``): arms x seeds as launcher runs.

Fast tests: the ablation file's errors name the key; the dry run of the shipped quickstart ablation composes
every run and starts nothing; the report (table numbers, PNG, commands) from hand-written metrics; the
services holder lets go when the ablation's process is gone. The end-to-end test runs a two-arm, one-seed
ablation of real ``tiny-test`` training runs (the ``lottery`` test environment, served once for both runs),
stops it with Ctrl-C after the first run, and checks that the second invocation finishes the other run
without redoing the first.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from env_service_fixture import REPO_ROOT, TESTS_DIR
from ports import free_port
from rich.console import Console
from training_fixture import kill_tree, training_command, training_timeout

from agentevolver.backends.cpu.precision import machine_summary
from agentevolver.errors import ConfigError
from agentevolver.experiments.cli import main
from agentevolver.experiments.hold import PARENT_ENV, READY_FILE
from agentevolver.experiments.plan import AblationPlan, plan_ablation
from agentevolver.experiments.report import _y_range, write_report
from agentevolver.experiments.runner import Runner
from agentevolver.experiments.spec import load_spec, parse_arms
from agentevolver.experiments.state import STATE_FILE, RunState, final_step_logged, relocate, same_preset

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
ABLATION = REPO_ROOT / "examples" / "ablation" / "quickstart.yaml"


def cli_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT)])}


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentevolver.experiments", *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, check=False)


def write_ablation(folder: Path, body: dict) -> Path:
    path = folder / "ablation.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "conf": str(QUICKSTART), **body}))
    return path


# -- the ablation file --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "arms", "fragment"),
    [
        ({"arms": {"a": {"include": ["b"]}}}, None, "arms.a.include: no arm 'b'"),
        ({"arms": {"a": {"include": ["b"]}, "b": {"include": ["a"]}}}, None, "arms include each other (a -> b -> a)"),
        ({"arms": {"a": {"overide": []}}}, None, "arms.a.overide"),
        ({"arms": {"a/b": {}}}, None, "an arm name is a folder name"),
        ({"arms": {}}, None, "arms"),
        ({"arms": {"a": {}}, "seeds": 0}, None, "seeds"),
        ({"arms": {"a": {}}}, "a,c", "--arms: no arm 'c' in the ablation file; its arms: a"),
        ({"arms": {"a": {}}, "conf": "nope.yaml"}, None, "conf: no training preset at"),
    ],
)
def test_bad_ablation_files_name_the_key(tmp_path: Path, body: dict, arms: str | None, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        spec = load_spec(write_ablation(tmp_path, body))
        parse_arms(spec, arms)
    assert fragment in str(info.value)


def test_a_training_preset_given_as_the_ablation_file_says_what_to_give() -> None:
    with pytest.raises(ConfigError, match="is a training preset, not an ablation file"):
        load_spec(QUICKSTART)


def test_included_arms_come_first_and_services_are_merged(tmp_path: Path) -> None:
    spec = load_spec(write_ablation(tmp_path, {"services": ["env"], "arms": {
        "x": {"overrides": ["a=1"], "services": ["llm"]},
        "y": {"overrides": ["b=2"], "services": ["memory", "llm"]},
        "both": {"include": ["x", "y"], "overrides": ["c=3"]}}}))
    both = spec.resolve("both")
    assert both.overrides == ["a=1", "b=2", "c=3"] and both.services == ["llm", "memory"]
    plan = plan_ablation(spec, tmp_path / "ablation.yaml", parse_arms(spec, "both,x"), [0, 1], tmp_path / "out", [])
    assert [run.key for run in plan.runs] == ["both/seed0", "both/seed1", "x/seed0", "x/seed1"]
    assert plan.services == ["env", "llm", "memory"]  # the shared services launch starts the union once
    argv = plan.runs[0].argv
    assert argv[argv.index("--conf") + 1] == str(QUICKSTART)
    assert argv[argv.index("--conf") + 2: argv.index("--")] == ["--with-env", "--with-llm", "--with-memory"]
    assert "--target" in plan.hold_argv and "agentevolver.experiments.hold" in plan.hold_argv


def test_dry_run_composes_every_run_and_starts_nothing(tmp_path: Path) -> None:
    done = run_cli(["ablation", "--conf", str(ABLATION), "--arms", "grpo,all", "--seeds", "2", "--out",
                    str(tmp_path / "abl"), "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for key in ("grpo/seed0", "grpo/seed1", "all/seed0", "all/seed1"):
        assert f"{key}  [new]  4 steps" in out
    # the arm's roles: who plays each (the environment where calc supplies the signal), the memory service
    assert "judge: env calc (step labels, code)" in out and "task_explorer: smollm2-135m-instruct" in out
    assert "task_summarizer: env calc (tasks rendered" in out and "reward: env calc" in out
    assert "exp_summarizer: none: solved episodes stored whole as exemplars (no LLM)" in out
    assert "shared services, started once for every run: env (http://127.0.0.1:8080/healthz), llm" in out
    assert "exp_mode=init_train" in out and "data.seed=1" in out and "trainer.resume_mode=auto" in out
    assert not (tmp_path / "abl").exists()


@pytest.mark.parametrize("ablation_file", sorted((REPO_ROOT / "examples" / "ablation").glob("*.yaml")),
                         ids=lambda path: path.stem)
def test_every_arm_of_every_shipped_ablation_composes(tmp_path: Path, ablation_file: Path) -> None:
    """An arm that is not in the documented command (sn_grow, sa_llm, ...) is still a shipped promise: a key
    renamed in the schema must fail here, not hours into someone's ablation."""
    spec = load_spec(ablation_file)
    done = run_cli(["ablation", "--conf", str(ablation_file), "--seeds", "1", "--out", str(tmp_path / "abl"),
                    "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for arm in spec.arms:
        assert f"{arm}/seed0  [new]" in done.stdout, done.stdout
    if ablation_file.stem == "self_evolution":  # its untrained base validates once: done at its step-0 line
        assert "base/seed0  [new]  validation only" in done.stdout, done.stdout
    assert not (tmp_path / "abl").exists()


def test_a_validation_only_run_is_done_at_its_step_0_validation(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "timing_s/testing": 3.0}) + "\n")
    assert not final_step_logged(tmp_path, 0)  # started, not yet validated
    metrics.write_text(json.dumps({"step": 0, "val-core/calc/acc/mean@1": 0.36}) + "\n")
    assert final_step_logged(tmp_path, 0) and not final_step_logged(tmp_path, 4)
    assert not final_step_logged(tmp_path, None)


def test_a_bad_override_of_one_arm_stops_before_anything_runs(tmp_path: Path) -> None:
    path = write_ablation(tmp_path, {"arms": {"ok": {}, "bad": {"overrides": ["agent_flow.max_steps=0"]}}})
    done = run_cli(["ablation", "--conf", str(path), "--out", str(tmp_path / "abl")], tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ablation: error: run bad/seed0 (arm 'bad')" in done.stderr and "agent_flow.max_steps" in done.stderr
    assert not (tmp_path / "abl").exists()


# -- the report ---------------------------------------------------------------------------------------------

def _fake_run(run_dir: Path, curve: dict[int, tuple[float, float]], wall_s: float, k: int = 4,
              machine: dict | None = None) -> None:
    run_dir.mkdir(parents=True)
    lines = []
    for step, (avg, best) in curve.items():
        line = {"step": step, f"val-core/calc/acc/mean@{k}": avg, f"val-core/calc/acc/best@{k}/mean": best,
                f"val-core/calc/reward/mean@{k}": 0.123}
        if step:
            line["timing_s/step"] = 10.0
        lines.append(json.dumps(line))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    attempts = [{"wall_s": wall_s / 2}, {"wall_s": wall_s / 2}]
    if machine:
        attempts = [{**attempt, "machine": machine} for attempt in attempts]  # one machine, listed once
    (run_dir / STATE_FILE).write_text(json.dumps({"status": "done", "attempts": attempts}))


def test_report_table_curves_and_commands(tmp_path: Path) -> None:
    spec = load_spec(write_ablation(tmp_path, {"services": ["env"], "arms": {
        "grpo": {}, "sa": {"overrides": ["attribution_driven_credit_assignment.enable=true"], "services": ["llm"]}}}))
    plan = plan_ablation(spec, tmp_path / "ablation.yaml", parse_arms(spec, None), [0, 1], tmp_path / "out", ["x=1"])
    for run in plan.runs:
        run.total_steps = 2
        run.roles = {"policy": "tiny-test", "env": "calc", "reward": "env calc"}
        if run.arm == "sa":
            run.roles["judge"] = "qwen (remote)"
    grpo0, grpo1, sa0, sa1 = plan.runs
    _fake_run(grpo0.run_dir, {0: (0.5, 0.6), 1: (0.55, 0.7), 2: (0.6, 0.8)}, 600,
              machine={"cpu": "Some Xeon", "cores": 2, "bf16": "amx_bf16"})
    _fake_run(grpo1.run_dir, {0: (0.5, 0.6), 2: (0.8, 0.9)}, 900)
    _fake_run(sa0.run_dir, {0: (0.4, 0.5), 2: (0.9, 1.0)}, 1200)
    sa1.run_dir.mkdir(parents=True)  # unfinished: one validation so far, where the env service refused episodes
    (sa1.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val-core/calc/acc/mean@4": 0.3,
                                                           "val-aux/calc/failed/mean@4": 0.185}) + "\n")

    results = write_report(plan, "python -m agentevolver.experiments ablation --conf x")
    assert [r.status for r in results] == ["done", "done", "done", "new"]
    readme = (plan.out / "README.md").read_text()
    # grpo: before 50, 50; after 60, 80 (mean 70, sample std 14.1); delta +10, +30 (mean +20, std 14.1);
    # reference columns avg / best after: 70.0 / 85.0; wall time 600 s and 900 s -> 12.5 min per run
    assert ("| grpo | 2/2 | 50.0 ± 0.0 | 70.0 ± 14.1 | +20.0 ± 14.1 | 70.0 / 85.0 | 12.5 min | policy: tiny-test; env: calc; "
            "reward: env calc |") in readme
    # sa: only seed 0 finished; its roles name the judge's model
    assert "| sa | 1/2 | 40.0 | 90.0 | +50.0 | 90.0 / 100.0 | 20.0 min | policy: tiny-test; env: calc; reward: " \
           "env calc; judge: qwen (remote) |" in readme
    assert "avg@4 before" in readme and "## Validation success on `calc` (%)" in readme
    # a validation with episodes a service ended is named (its score is not the model's alone); the others are not
    assert "- **sa/seed1**: step 0: calc 18.5% of the validation episodes ended by a service failure" in readme
    assert readme.count("of the validation episodes ended by a service failure") == 1
    assert "| sa | 1 | new | 0 | calc: 30.0 → — | — | not recorded |" in readme
    assert "| grpo | 0 | done | 2 | calc: 50.0 → 60.0 | 10.0 min | Some Xeon, 2 cores, amx_bf16 |" in readme
    png = (plan.out / "curves.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    commands = (plan.out / "commands.sh").read_text()
    assert commands.count("-m agentevolver.launcher --conf") == 5  # 4 runs + the (commented) services launch
    assert "# sa, seed 1 ->" in commands and "--with-env --with-llm -- attribution_driven_credit_assignment" \
           ".enable=true" in commands and "x=1" in commands
    summary = json.loads((plan.out / "summary.json").read_text())
    assert summary["arms"][0]["validation"]["calc"]["after"] == [0.6, 0.8]
    assert summary["runs"][0]["machines"] == [{"cpu": "Some Xeon", "cores": 2, "bf16": "amx_bf16"}]

    # `report FOLDER` rewrites the same report from the folder's ablation.json, without composing anything
    (plan.out / "ablation.json").write_text(json.dumps({**plan.to_json(), "command_line": "python -m x"}))
    (plan.out / "README.md").unlink()
    (sa1.run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "val-core/calc/acc/mean@4": 0.3, "timing_s/step": 1.0}) + "\n" for s in (0, 2)))
    assert main(["report", str(plan.out)], console=Console(file=io.StringIO())) == 0
    readme = (plan.out / "README.md").read_text()
    assert "| sa | 2/2 | 35.0 ± 7.1 | 60.0 ± 42.4 |" in readme  # sa seed 1 finished since (its final step)
    assert json.loads((sa1.run_dir / STATE_FILE).read_text())["status"] == "done"


def test_the_curves_axis_spans_the_values_so_a_few_points_show() -> None:
    assert _y_range([42.2, 46.1]) == (37.2, 51.1)  # 5 points either side
    assert _y_range([50.0]) == (45.0, 55.0)  # at least 10 points wide
    assert _y_range([0.0, 100.0]) == (-2.0, 102.0)  # never past 0-100 (with the edge's 2 points)
    assert _y_range([]) == (-2.0, 102.0)


def test_report_compares_each_arm_with_its_baseline_seed_by_seed(tmp_path: Path) -> None:
    spec = load_spec(write_ablation(tmp_path, {"baseline": "grpo", "arms": {
        "grpo": {}, "sn": {"overrides": ["exp_mode=init_train"]}, "few": {"overrides": ["data.train_max_samples=8"]},
        "sq": {"baseline": "few", "overrides": ["task_manager.n=2"]}}}))
    arms = parse_arms(spec, None)
    assert {a.name: a.baseline for a in arms} == {"grpo": None, "sn": "grpo", "few": "grpo", "sq": "few"}
    plan = plan_ablation(spec, tmp_path / "ablation.yaml", arms, [0, 1, 2], tmp_path / "out", [])
    finals = {"grpo": (0.40, 0.50, 0.45), "sn": (0.50, 0.55, 0.55), "few": (0.30, 0.30, 0.30), "sq": (0.30, 0.40, 0.20)}
    for run in plan.runs:
        run.total_steps = 2
        _fake_run(run.run_dir, {0: (0.3, 0.3), 2: (finals[run.arm][run.seed],) * 2}, 60)
        if run.arm == "sn":  # Self-Navigating's split of training success, and validation without experience
            lines = (run.run_dir / "metrics.jsonl").read_text().splitlines()
            lines.append(json.dumps({"step": 1, "exp/success_with_experience": 0.5,
                                     "exp/success_without_experience": 0.25}))
            second = {"val-exp_all-core/calc/acc/mean@4": finals["sn"][run.seed] + 0.1} if run.seed < 2 else {}
            lines.append(json.dumps({"step": 2, "val-aux/calc/experience/mean@4": 0.0, **second}))
            (run.run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        if run.arm == "sq" and run.seed < 2:  # the generation funnel, logged with step 1 (seed 2: none logged)
            funnel = {"step": 1, "tasks/explorations": 16.0, "tasks/explorations_failed": float(run.seed),
                      "tasks/explorations_without_tool_calls": 2.0 * run.seed,
                      "tasks/proposed": 5.0, "tasks/written": 4.0, "tasks/train": 12.0, "tasks/train_synthetic": 4.0,
                      "tasks/rejected": 12.0, "tasks/rejected/env_seed_copies": 9.0,
                      "tasks/rejected/exact_duplicate": 1.0, "tasks/rejected/answer_answer_in_query": 2.0}
            with (run.run_dir / "metrics.jsonl").open("a") as out:
                out.write(json.dumps(funnel) + "\n")
    results = write_report(plan, "python -m agentevolver.experiments ablation --conf x")
    readme = (plan.out / "README.md").read_text()
    # sn - grpo per seed: +10, +5, +10 -> mean +8.3, sd 2.89, t(0.975, 2) = 4.303 -> half width 7.17
    assert "| sn | grpo | 3 | +8.3 | [+1.2, +15.5] | 0: +10.0, 1: +5.0, 2: +10.0 |" in readme
    # sq against few (not grpo): 0, +10, -10 -> mean 0, interval +-24.8
    assert "| sq | few | 3 | +0.0 | [-24.8, +24.8] | 0: +0.0, 1: +10.0, 2: -10.0 |" in readme
    assert "| grpo | grpo |" not in readme
    # the second pass on the final weights (val_compare_mode=all) ran on seeds 0 and 1: 60 and 65, +10 each
    assert ("| sn | 50.0 ± 0.0 | 25.0 ± 0.0 | 53.3 ± 2.9 (0% with experience) | all: 62.5 ± 3.5 (Δ +10.0 ± 0.0, "
            "2 seeds) |") in readme
    pair = next(a for a in json.loads((plan.out / "summary.json").read_text())["arms"] if a["arm"] == "sn")
    assert pair["validation"]["calc"]["paired"]["baseline"] == "grpo"
    sn_runs = [r for r in json.loads((plan.out / "summary.json").read_text())["runs"] if r["arm"] == "sn"]
    assert [r["compared_after"] for r in sn_runs] == [{"all": {"calc": 0.6}}, {"all": {"calc": 0.65}}, {}]
    assert [r.status for r in results] == ["done"] * 12
    # Self-Questioning's synthetic tasks, per run that generated, rejections by reason (most first)
    assert "## Self-Questioning: synthetic tasks per run" in readme
    assert ("| sq | 0 | 16 | 5 | 4 | 4 of 12 | 12 | env_seed_copies 9, answer_answer_in_query 2, exact_duplicate 1 |"
            in readme)
    assert "| sq | 1 | 16 (1 failed, 2 without a tool call) | 5 | 4 |" in readme and "| sq | 2 |" not in readme.split("## Runs")[0]
    sq_runs = [r for r in json.loads((plan.out / "summary.json").read_text())["runs"] if r["arm"] == "sq"]
    assert [r["tasks"].get("tasks/written") for r in sq_runs] == [4.0, 4.0, None]
    with pytest.raises(ConfigError, match="baseline: no arm 'nope'"):
        load_spec(write_ablation(tmp_path, {"baseline": "nope", "arms": {"a": {}}}))


def _checkout(root: Path, extra: list[str] | None = None) -> list:
    """A checkout at ``root`` (a preset, an ablation file naming it relatively): the runs of its ablation."""
    (root / "examples" / "ablation").mkdir(parents=True)
    (root / "examples" / "preset.yaml").write_text(QUICKSTART.read_text())
    ablation = root / "examples" / "ablation" / "t.yaml"
    ablation.write_text(yaml.safe_dump({"name": "t", "conf": "../preset.yaml", "arms": {"a": {}}}))
    spec = load_spec(ablation)
    plan = plan_ablation(spec, ablation, parse_arms(spec, None), [0], root / "ablations" / "t", extra or [])
    return plan.runs


def test_a_finished_ablation_in_a_moved_checkout_is_the_same_command(tmp_path: Path) -> None:
    """The state file records absolute paths; a clone of the repository elsewhere holds the same runs."""
    (old_run,) = _checkout(tmp_path / "old")
    RunState(old_run).save(status="done")
    assert f"trainer.default_local_dir={tmp_path / 'old'}" in old_run.overrides[-4]

    new_root = tmp_path / "elsewhere" / "clone"
    (new_run,) = _checkout(new_root)
    (new_run.run_dir / STATE_FILE).parent.mkdir(parents=True)
    (new_run.run_dir / STATE_FILE).write_text((old_run.run_dir / STATE_FILE).read_text())
    RunState(new_run).check_same_command()  # the preset, the run folder and the records moved: the same run

    (changed,) = _checkout(tmp_path / "third", ["x=1"])
    (changed.run_dir / STATE_FILE).parent.mkdir(parents=True)
    (changed.run_dir / STATE_FILE).write_text((old_run.run_dir / STATE_FILE).read_text())
    with pytest.raises(ConfigError, match="was made with another command"):
        RunState(changed).check_same_command()  # moved and changed: still refused


def test_a_preset_of_this_checkout_is_the_same_preset_from_another_checkout() -> None:
    """Runs started from a worktree (``--out`` in the main checkout) are reported from the main checkout: the
    run folders did not move, only the preset's checkout did."""
    here = REPO_ROOT / "examples" / "calc_self_questioning.yaml"
    assert same_preset("/tmp/se_tree/examples/calc_self_questioning.yaml", here)
    assert same_preset(str(here), here)
    assert not same_preset("/tmp/se_tree/examples/quickstart.yaml", here)
    assert not same_preset("/tmp/se_tree/other/calc_self_questioning.yaml", here)
    assert not same_preset("/tmp/a/preset.yaml", Path("/tmp/b/preset.yaml"))  # outside the checkout: path only


def test_relocate_moves_only_paths_under_the_old_root() -> None:
    old, new = Path("/a/repo/abl/t/runs/x/seed0"), Path("/b/c/abl/t/runs/x/seed0")
    texts = ["/a/repo/preset.yaml", "trainer.default_local_dir=/a/repo/abl/t/runs/x/seed0", "k=/a/repository",
             "k=/elsewhere/a/repo", "plain=1"]
    assert relocate(texts, old, new) == ["/b/c/preset.yaml", "trainer.default_local_dir=/b/c/abl/t/runs/x/seed0",
                                         "k=/a/repository", "k=/elsewhere/a/repo", "plain=1"]
    # another --out (only runs/<arm>/seed<k> in common): only the ablation folder moves, not the preset
    assert relocate(["/a/repo/preset.yaml", "r=/a/repo/abl/t/records"], old, Path("/o/runs/x/seed0")) == [
        "/a/repo/preset.yaml", "r=/o/records"]
    # another arm or seed: nothing moves
    assert relocate(["k=/a/repo/abl"], old, Path("/b/c/abl/t/runs/y/seed0")) == ["k=/a/repo/abl"]
    assert relocate(["k=/a/repo/abl"], None, new) == ["k=/a/repo/abl"]


def test_a_run_redone_from_step_0_sets_its_old_metrics_aside_and_counts_only_its_own_time(tmp_path: Path) -> None:
    (run,) = _checkout(tmp_path)
    state = RunState(run)
    state.save(status="failed", attempts=[{"wall_s": 100.0, "from_step": 0}, {"wall_s": 40.0, "from_step": 0},
                                          {"wall_s": 30.0, "from_step": 2}])
    assert state.wall_s() == 70.0  # the second attempt started again from scratch; the third resumed it
    state.save(attempts=[{"wall_s": 100.0}, {"wall_s": 40.0}])
    assert state.wall_s() == 140.0  # recorded before from_step existed: all of them

    (run.run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "old/key": 1.0}) + "\n")
    console = io.StringIO()
    Runner(plan_of(run), Console(file=console)).set_aside_metrics(run, 3)
    assert not (run.run_dir / "metrics.jsonl").exists()
    assert "old/key" in (run.run_dir / "metrics.before-attempt3.jsonl").read_text()
    assert "metrics.before-attempt3.jsonl" in console.getvalue()


def plan_of(run) -> AblationPlan:
    """A plan around one run (what the runner's console messages need)."""
    spec = load_spec(run.conf.parent / "ablation" / "t.yaml")
    return plan_ablation(spec, run.conf.parent / "ablation" / "t.yaml", parse_arms(spec, None), [run.seed],
                         run.run_dir.parents[2], [])


def test_the_services_holder_lets_go_when_the_ablation_is_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    holder = subprocess.run([sys.executable, "-m", "agentevolver.experiments.hold", "--config-path", str(tmp_path)],
                            env={**cli_env(), PARENT_ENV: str(gone.pid)}, capture_output=True, text=True,
                            timeout=120, check=False)
    assert holder.returncode == 0 and "is gone: releasing the services" in holder.stderr
    assert (tmp_path / READY_FILE).is_file()


def test_a_failed_run_gets_fresh_shared_services_before_the_next_run(tmp_path: Path) -> None:
    """A run that dies leaves its env instances live in the shared services (issue 43: the next run's
    validation was refused a fifth of its instances): the runner restarts the services before the next run.
    The services launch is a stand-in that counts its starts; the runs are real processes that fail."""
    (tmp_path / "examples" / "ablation").mkdir(parents=True)
    (tmp_path / "examples" / "preset.yaml").write_text(QUICKSTART.read_text())
    ablation = tmp_path / "examples" / "ablation" / "t.yaml"
    ablation.write_text(yaml.safe_dump({"name": "t", "conf": "../preset.yaml", "services": ["env"],
                                        "arms": {"a": {}, "b": {}, "c": {}}}))
    spec = load_spec(ablation)
    plan = plan_ablation(spec, ablation, parse_arms(spec, None), [0], tmp_path / "abl", [])
    starts, ready = tmp_path / "starts.txt", plan.hold_record / READY_FILE
    plan.hold_argv = [sys.executable, "-c", (
        "import pathlib, signal, sys, time\n"
        f"pathlib.Path({str(starts)!r}).open('a').write('start\\n')\n"
        f"ready = pathlib.Path({str(ready)!r}); ready.parent.mkdir(parents=True, exist_ok=True); ready.touch()\n"
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"
        "time.sleep(600)\n")]
    plan.runs[0].argv = [sys.executable, "-c", "import sys; sys.exit(3)"]  # a fails
    plan.runs[1].argv = [sys.executable, "-c", "pass"]  # b ends well (no step count composed: done), c fails last
    plan.runs[2].argv = plan.runs[0].argv
    console = io.StringIO()
    code = Runner(plan, Console(file=console, width=300)).run()
    out = console.getvalue()
    assert code == 1, out
    assert "a/seed0 failed: restarting the shared services" in out, out
    # started once, then again after a; not after b (done) nor after c (no run after it)
    assert starts.read_text().splitlines() == ["start"] * 2, out
    assert "b/seed0: done" in out and "c/seed0 failed: restarting" not in out


# -- end to end ---------------------------------------------------------------------------------------------

def _state(run_dir: Path) -> dict:
    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


@training_timeout
def test_two_arm_ablation_trains_reports_and_resumes_without_redoing_finished_runs(tmp_path: Path) -> None:
    env_port = free_port()
    shared = [o for o in training_command(f"http://127.0.0.1:{env_port}", tmp_path)[5:] if not o.startswith((
        "trainer.total_training_steps=", "trainer.default_local_dir=", "trainer.save_freq=", "trainer.test_freq=",
        "trainer.val_before_train=", "actor_rollout_ref.actor.checkpoint."))]
    shared += ["trainer.total_training_steps=1", "trainer.val_before_train=true", "trainer.test_freq=1",
               "trainer.save_freq=-1", "actor_rollout_ref.rollout.val_kwargs.n=2",
               "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
               "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
               "launcher.services.env.extra_args=[--plugin,envs_for_tests,--log-level,warning]",
               "launcher.poll_interval_s=0.2"]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tiny", "conf": str(QUICKSTART), "services": ["env"], "overrides": shared,
        "seed_overrides": ["data.seed={seed}", "actor_rollout_ref.rollout.seed={seed}"],
        "arms": {"grpo": {"description": "baseline"},
                 "lr_high": {"description": "ten times the learning rate",
                             "overrides": ["actor_rollout_ref.actor.optim.lr=1e-3"]}},
    }, sort_keys=False))
    out = tmp_path / "abl"
    command = [sys.executable, "-m", "agentevolver.experiments", "ablation", "--conf", str(path), "--out", str(out)]
    grpo, lr_high = out / "runs" / "grpo" / "seed0", out / "runs" / "lr_high" / "seed0"

    # 1. the first invocation: stopped with Ctrl-C once the first run is done
    first_log = tmp_path / "first.log"
    with first_log.open("w") as log:
        first = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        while _state(grpo).get("status") != "done":
            assert first.poll() is None, first_log.read_text()[-8000:]
            time.sleep(1)
        first.send_signal(signal.SIGINT)
        first.wait(timeout=600)
    except BaseException:
        kill_tree(first)
        raise
    first_out = first_log.read_text()
    assert first.returncode == 130, first_out[-8000:]
    assert "SIGINT received: stopped; run the same command again" in first_out
    assert _state(lr_high).get("status") != "done"
    grpo_metrics = (grpo / "metrics.jsonl").read_bytes()
    assert (out / "README.md").is_file()  # the report is written after every run and at the end

    # 2. the same command again: only the unfinished run trains
    second = subprocess.Popen(command, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        second_out = second.communicate()[0]
    except BaseException:
        kill_tree(second)
        raise
    assert second.returncode == 0, second_out[-8000:]
    assert "1 of 2 runs already done (skipped): grpo/seed0" in second_out
    assert "lr_high/seed0: done in" in second_out and "grpo/seed0: done in" not in second_out
    assert len(_state(grpo)["attempts"]) == 1 and (grpo / "metrics.jsonl").read_bytes() == grpo_metrics
    assert _state(lr_high)["status"] == "done" and _state(lr_high)["attempts"][-1]["exit_code"] == 0
    assert _state(lr_high)["attempts"][-1]["machine"] == machine_summary()  # the report's machine column
    assert _state(lr_high)["attempts"][-1]["from_step"] == 0  # no checkpoints (save_freq -1): from scratch

    # services: started once by the services launch, reused by every run, stopped at the end
    records = out / "records"
    held = json.loads((records / "tiny-services" / "launch.json").read_text())
    assert [(s["name"], s["action"]) for s in held["services"]] == [("env", "started")]
    for experiment in ("tiny-grpo-seed0", "tiny-lr_high-seed0"):
        launch = json.loads((records / experiment / "launch.json").read_text())
        assert [(s["name"], s["action"]) for s in launch["services"]] == [("env", "reused")]
        assert launch["exit_code"] == 0
    with pytest.raises(OSError):  # nothing listens on the env port any more
        socket_probe(env_port)

    # the report: table with both arms and their roles, the PNG, the exact commands
    readme = (out / "README.md").read_text()
    assert "## Validation success on `lottery` (%)" in readme and "avg@2 / best@2 after" in readme
    assert f"| {machine_summary()['cpu']}, {machine_summary()['cores']} cores, " in readme
    for arm in ("grpo", "lr_high"):  # its row of the arm table: 1 of 1 seeds finished, with the run's roles
        row = next(line for line in readme.splitlines() if line.startswith(f"| {arm} | 1/1 | "))
        assert row.endswith(" | policy: tiny-test; env: lottery; reward: env lottery |")
    assert (out / "curves.png").read_bytes().startswith(b"\x89PNG")
    commands = (out / "commands.sh").read_text()
    assert commands.count("--with-env -- ") == 2 and "actor_rollout_ref.actor.optim.lr=1e-3" in commands
    assert f"trainer.default_local_dir={grpo}" in commands
    summary = json.loads((out / "summary.json").read_text())
    assert {run["arm"]: run["status"] for run in summary["runs"]} == {"grpo": "done", "lr_high": "done"}
    assert all(run["avg"]["lottery"].keys() == {"0", "1"} for run in summary["runs"])


def socket_probe(port: int) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
