"""The trajectory viewer (``python -m agentevolver.logview``) over a recorded tiny run.

The run is recorded for real: step 1 by ``python -m agentevolver.rollout`` (``tiny-test`` on ``calc``
against the real environment service); step 2 by the same AgentFlow in process, with experience injected
into one group and GRPO advantages from verl's own estimator, plus per-step GOOD/BAD flags standing in
for the Self-Attributing judge (issue 9) that will write them. ``metrics.jsonl`` lines are written here in
the trainer's format. A corrupt copy of a step, a missing step and a run that is still writing are made
from it. The viewer is started through its real entry point and read over HTTP and in headless Chromium.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from env_service_fixture import REPO_ROOT, env_service
from fastapi.testclient import TestClient
from ports import free_port
from test_rollout_cli import COMMON, run_cli

from agentevolver.logview import create_app
from agentevolver.logview.episodes import parse_record, step_label
from agentevolver.logview.runs import discover_runs, read_metrics_file
from agentevolver.module.agent_flow import RolloutDumpWriter, read_rollout_dump

EXPERIENCE = "\n\nExperience: call the calculator tool before answering."


async def _record_flow_step(service: str, run: Path, step: int) -> None:
    """One step through the real AgentFlow: a calc group with experience, a lottery group without."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from agentevolver.backends.cpu import HFGenerator
    from agentevolver.client.env_client import EnvClient
    from agentevolver.config import load_config
    from agentevolver.module.agent_flow import AgentFlow
    from agentevolver.module.agent_flow.runner import group_specs, run_episodes
    from agentevolver.module.task_manager.store import original_objectives
    from agentevolver.verl.agent_loop import flow_budgets

    cfg, settings = load_config([f"env_service.env_url={service}", *COMMON])
    budgets = flow_budgets(cfg)
    generator = HFGenerator.from_pretrained("tiny-test", seed=0, default_max_tokens=budgets["max_response_len"])
    async with EnvClient.from_config(settings.env_service) as env:
        flow = AgentFlow(settings.agent_flow, tokenizer=generator.tokenizer, env_client=env,
                         generate=generator.generate, **budgets)
        calc_task = (await env.aget_env_profile("calc", "val"))[0]
        specs = (group_specs(original_objectives([calc_task], "calc", "env"), 2, experience=EXPERIENCE)
                 + group_specs(original_objectives(["t8"], "lottery", "env"), 4))
        results = await run_episodes(flow, specs, {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True})
    await generator.aclose()
    # GRPO advantages as the trainer computes them: the outcome on the last response token, verl's estimator.
    width = max(len(r.final_sample.response_ids) for r in results)
    mask = torch.zeros(len(results), width)
    rewards = torch.zeros(len(results), width)
    for row, result in enumerate(results):
        sample_mask = result.final_sample.response_mask
        mask[row, : len(sample_mask)] = torch.tensor(sample_mask, dtype=torch.float32)
        rewards[row, len(sample_mask) - 1] = result.reward.outcome
    advantages, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([r.group_id for r in results]))
    records = []
    for row, result in enumerate(results):
        record = result.to_dump_record(
            step=step, advantages=advantages[row, : len(result.final_sample.response_ids)].tolist())
        # stand-in for the judge's labels: the last step of a failed episode is BAD, every other step GOOD
        record["step_flags"] = [not (turn == result.num_turns - 1 and not result.success)
                                for turn in range(result.num_turns)]
        records.append(record)
    RolloutDumpWriter(run / "rollouts").write_records(step, records)


def _metrics_line(step: int, **values: float) -> str:
    return json.dumps({"step": step, **values}) + "\n"


@pytest.fixture(scope="module")
def recorded_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<root>/agentevolver/tiny``: steps 1 and 2 recorded as described in the module docstring."""
    root = tmp_path_factory.mktemp("logview_root")
    run = root / "agentevolver" / "tiny"
    with env_service("calc,lottery", tmp_path=tmp_path_factory.mktemp("logview_env")) as service:
        done = run_cli("--split", "val", "--num-tasks", "2", "--n", "2", "--run-dir", str(run), "--step", "1",
                       "--seed", "0", f"env_service.env_url={service.url}", "env_service.env_type=calc", *COMMON)
        assert done.returncode == 0, done.stdout + done.stderr
        asyncio.run(_record_flow_step(service.url, run, step=2))
    with open(run / "metrics.jsonl", "w") as out:
        for step, score in ((1, 0.0), (2, 0.5)):
            out.write(_metrics_line(step, **{"critic/score/mean": score, "episode/success_rate": score / 2,
                                             "actor/pg_loss": 0.1 / step, "actor/kl_loss": 0.001 * step,
                                             "response_length/mean": 40.0 + step, "timing_s/step": 12.5}))
    # a second run: a corrupt copy of step 1 (a truncated line and a record with a wrong-typed field)
    broken = root / "agentevolver" / "broken" / "rollouts"
    broken.mkdir(parents=True)
    lines = (run / "rollouts" / "step_1.jsonl").read_text().splitlines()
    bad_record = json.loads(lines[1])
    bad_record["response_mask"] = "not a list"
    (broken / "step_1.jsonl").write_text("\n".join([lines[0], lines[2][: len(lines[2]) // 2],
                                                    json.dumps(bad_record), "[1, 2]"]) + "\n")
    return root


@contextlib.contextmanager
def viewer(root: Path, *extra: str, log: Path) -> Iterator[str]:
    """``python -m agentevolver.logview`` on a free port; yields its URL once /healthz answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-m", "agentevolver.logview", "--root", str(root), "--port",
                                    str(port), *extra], cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # readiness deadline, not a test time limit
    try:
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """The first episode page loads the tokenizer, which takes a while on a busy machine."""
    with httpx.Client(timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def served(recorded_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("logview_server") / "viewer.log"
    with viewer(recorded_root, "--tokenizer", "tiny-test", log=log) as url:
        yield url


# ---------------------------------------------------------------------------------------------------------
# The real entry point over HTTP
# ---------------------------------------------------------------------------------------------------------


def test_healthz_and_pages_of_the_recorded_run(served: str, recorded_root: Path, http: httpx.Client) -> None:
    health = http.get(f"{served}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert health.json()["root"] == str(recorded_root.resolve())
    index = http.get(served).text
    assert "agentevolver/tiny" in index and "agentevolver/broken" in index
    run = http.get(f"{served}/run", params={"run": "agentevolver/tiny"}).text
    assert "step 1" in run and "step 2" in run and "<svg" in run and "Success rate" in run
    step = http.get(f"{served}/step", params={"run": "agentevolver/tiny", "step": 2})
    assert step.status_code == 200 and "6 episodes" in step.text and "GOOD" in step.text
    records = list(read_rollout_dump(recorded_root / "agentevolver/tiny/rollouts/step_2.jsonl"))
    assert [r["experience_span"] is not None for r in records] == [True, True, False, False, False, False]
    episode = http.get(f"{served}/episode", params={"run": "agentevolver/tiny", "step": 2, "line": 1}).text
    assert 'class="tok prompt exp"' in episode and "Experience: call the calculator" in episode
    assert "token text decoded with tiny-test" in episode


def test_step_filters_and_sort(served: str, recorded_root: Path, http: httpx.Client) -> None:
    records = list(read_rollout_dump(recorded_root / "agentevolver/tiny/rollouts/step_2.jsonl"))
    failed = sum(not r["success"] for r in records)
    page = http.get(f"{served}/step", params={"run": "agentevolver/tiny", "step": 2, "failed": "true"}).text
    assert page.count('class="episode-link"') == failed and f"{failed} shown" in page
    page = http.get(f"{served}/step", params={"run": "agentevolver/tiny", "step": 2, "task": "t8"}).text
    assert page.count('class="episode-link"') == 4
    page = http.get(f"{served}/step", params={"run": "agentevolver/tiny", "step": 2, "sort": "reward",
                                               "order": "desc"}).text
    lines = [int(part.split('">')[1].split("<")[0]) for part in page.split('class="episode-link"')[1:]]
    rewards = [records[line - 1]["reward"]["outcome"] for line in lines]
    assert rewards == sorted(rewards, reverse=True)


def test_missing_and_corrupt_files_are_readable_pages(served: str, http: httpx.Client) -> None:
    missing = http.get(f"{served}/step", params={"run": "agentevolver/tiny", "step": 9})
    assert missing.status_code == 404 and "has no dump for step 9" in missing.text and "steps with dumps: 1, 2" in missing.text
    corrupt = http.get(f"{served}/step", params={"run": "agentevolver/broken", "step": 1})
    assert corrupt.status_code == 200
    assert "line 2: not valid JSON" in corrupt.text and "line 4: a JSON list, not an episode object" in corrupt.text
    assert corrupt.text.count('class="episode-link"') == 2
    wrong_type = http.get(f"{served}/episode", params={"run": "agentevolver/broken", "step": 1, "line": 3})
    assert wrong_type.status_code == 200 and "field &#39;response_mask&#39;" in wrong_type.text
    for params, expected in (({"run": "../..", "step": 1}, "outside the viewer"),
                             ({"run": "nope", "step": 1}, "not found"),
                             ({"run": "agentevolver/tiny", "step": "x"}, "query parameter &#39;step&#39;"),
                             ({"run": "agentevolver/tiny", "step": 1, "line": 99}, "no episode on line 99")):
        page = http.get(f"{served}/{'episode' if 'line' in params else 'step'}", params=params)
        assert page.status_code >= 400 and expected in page.text and "Traceback" not in page.text, page.text


# ---------------------------------------------------------------------------------------------------------
# Headless Chromium
# ---------------------------------------------------------------------------------------------------------


def _chromium() -> tuple[str, str]:
    browser = next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium chromium-driver; .ci/run does it)")
    return browser, driver


def test_browser_episode_view_and_corrupt_dump(served: str, recorded_root: Path, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    browser, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.get(served)
        driver.find_element(By.LINK_TEXT, "agentevolver/tiny").click()
        assert driver.find_elements(By.CSS_SELECTOR, "svg.chart")
        driver.find_element(By.LINK_TEXT, "step 2").click()
        rows = driver.find_elements(By.CSS_SELECTOR, "table.episodes tbody tr")
        assert len(rows) == 6
        rows[0].find_element(By.CSS_SELECTOR, "a.episode-link").click()

        policy = driver.find_elements(By.CSS_SELECTOR, "#response-tokens .tok.policy")
        observation = driver.find_elements(By.CSS_SELECTOR, "#response-tokens .tok.observation")
        prompt = driver.find_elements(By.CSS_SELECTOR, ".prompt-tokens .tok.prompt:not(.exp)")
        experience = driver.find_elements(By.CSS_SELECTOR, ".prompt-tokens .tok.exp")
        assert policy and prompt and experience
        colours = {name: {t.value_of_css_property("background-color") for t in tokens[:20]}
                   for name, tokens in (("policy", policy), ("observation", observation), ("prompt", prompt),
                                        ("experience", experience)) if tokens}
        assert all(len(found) == 1 for found in colours.values()), colours
        assert colours["policy"] != colours["prompt"] and colours["policy"] != colours["experience"]
        if "observation" in colours:
            assert colours["policy"] != colours["observation"]
        assert "step 0" in (policy[0].get_attribute("title") or "")
        assert driver.find_elements(By.CSS_SELECTOR, "svg.heat")  # step 2 has advantages
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, min(height, 6000))
        screenshot = tmp_path / "episode_view.png"
        assert driver.save_screenshot(str(screenshot))
        print(f"episode view screenshot: {screenshot}")

        driver.get(f"{served}/step?run=agentevolver/broken&step=1")
        problems = driver.find_element(By.CSS_SELECTOR, ".problems").text
        assert "line 2: not valid JSON" in problems
        driver.get(f"{served}/step?run=agentevolver/tiny&step=9")
        assert "has no dump for step 9" in driver.find_element(By.ID, "error").text

        # a run that is still writing: the run page notices the new step and offers a reload
        driver.get(f"{served}/run?run=agentevolver/broken")
        live = driver.find_element(By.ID, "live")
        assert not live.is_displayed()
        broken = recorded_root / "agentevolver" / "broken" / "rollouts"
        (broken / "step_2.jsonl").write_text((broken / "step_1.jsonl").read_text().splitlines()[0] + "\n")
        WebDriverWait(driver, 60).until(expected_conditions.visibility_of(live))  # polls every 5 s
    finally:
        driver.quit()


# ---------------------------------------------------------------------------------------------------------
# In process (no model): discovery, a run that is still writing, record parsing
# ---------------------------------------------------------------------------------------------------------


def _record(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"step": 0, "task_id": "a", "group_id": "a", "rollout_id": 0, "termination": "finished",
                               "num_turns": 1, "reward": {"outcome": 1.0, "success_rate": 1.0}, "success": True,
                               "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6], "response_mask": [1, 1, 0],
                               "response_logprobs": [-0.1, -0.2, 0.0], "step_ids": [0, 0, -1], "messages": []}
    return {**base, **fields}


def test_discovery_finds_runs_at_bounded_depth(tmp_path: Path) -> None:
    (tmp_path / "p" / "a" / "rollouts").mkdir(parents=True)
    (tmp_path / "p" / "a" / "global_step_1" / "rollouts").mkdir(parents=True)  # inside a run: not searched
    (tmp_path / "p" / "b").mkdir(parents=True)
    (tmp_path / "p" / "b" / "metrics.jsonl").write_text("")
    (tmp_path / "custom_dumps").mkdir()
    (tmp_path / "custom_dumps" / "step_3.jsonl").write_text("")
    (tmp_path / "x" / "y" / "z" / "w" / "v" / "rollouts").mkdir(parents=True)  # deeper than max_depth
    assert [run.id for run in discover_runs(tmp_path, max_depth=4)] == ["custom_dumps", "p/a", "p/b"]
    assert [run.id for run in discover_runs(tmp_path / "p" / "a")] == ["."]
    assert discover_runs(tmp_path / "absent") == []


def test_a_run_that_is_still_writing(tmp_path: Path) -> None:
    client = TestClient(create_app(tmp_path / "run"))
    assert "does not exist yet" in client.get("/").text  # the launcher may start the viewer first
    dumps = tmp_path / "run" / "rollouts"
    writer = RolloutDumpWriter(dumps)
    writer.write_records(1, [_record(step=1)])
    (dumps / ".step_2.jsonl.tmp123").write_text('{"half": ')  # the writer's temporary file: ignored
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(_metrics_line(1, **{"critic/score/mean": 1.0}) + '{"step": 2, "critic/sc')
    assert client.get("/api/run", params={"run": "."}).json() == {"steps": [1], "metrics_lines": 1}
    page = client.get("/run", params={"run": "."}).text
    assert "role=\"alert\"" not in page and "Reward" in page  # the unfinished metrics line is no error
    writer.write_records(2, [_record(step=2), _record(step=2, task_id="b", success=False)])
    metrics.write_text(metrics.read_text() + 'ore/mean": 0.5}\n')
    assert client.get("/api/run", params={"run": "."}).json() == {"steps": [1, 2], "metrics_lines": 2}
    assert "2 episodes" in client.get("/step", params={"run": ".", "step": 2}).text
    assert read_metrics_file(metrics).series["critic/score/mean"] == [(1, 1.0), (2, 0.5)]


def test_metrics_in_verl_file_logger_shape_and_bad_lines(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 1, "data": {"actor/pg_loss": 0.5, "note": "x", "flag": True}}) + "\n"
                       + "garbage\n" + json.dumps({"data": {}}) + "\n")
    read = read_metrics_file(metrics)
    assert read.series == {"actor/pg_loss": [(1, 0.5)]}
    assert read.problems[0].startswith("line 2: not valid JSON") and read.problems[1] == 'line 3: no integer "step" field'
    page = TestClient(create_app(tmp_path)).get("/run", params={"run": "."}).text
    assert "line 2: not valid JSON" in page and "No rollout dumps" in page


def test_parse_record_drops_wrong_fields_and_names_them() -> None:
    view, problems = parse_record(_record(reward="high", step_ids=[0, 0]))
    assert view.reward is None and view.task_id == "a"
    assert any(p.startswith("field 'reward'") for p in problems)
    assert any("'step_ids' has 2 entries but response_ids has 3" in p for p in problems)
    assert [step_label(flag) for flag in (True, False, "good", "BAD", None, "meh")] == \
        ["GOOD", "BAD", "GOOD", "BAD", None, None]


def test_episode_without_tokenizer_shows_ids_and_labels(tmp_path: Path) -> None:
    RolloutDumpWriter(tmp_path / "rollouts").write_records(0, [
        _record(step_flags=["GOOD"], advantages=[0.5, 0.5, 0.0], messages=None,
                experience_span=[1, 2], exp_mask=True)])
    page = TestClient(create_app(tmp_path)).get("/episode", params={"run": ".", "step": 0, "line": 1}).text
    assert "no tokenizer: start the viewer with --tokenizer" in page
    assert '<span class="tok policy GOOD" title="#3 · id 4 · policy · step 0 GOOD · logprob -0.100 · ' \
           'advantage +0.5000" data-adv="0.5">4</span>' in page
    assert '<span class="tok prompt exp"' in page and "stripped for training" in page
    assert "has no conversation" in page and "svg class=\"heat\"" in page


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for args, expected in ((["--root", str(tmp_path / "file")], "is a file"),
                           (["--root", str(tmp_path), "--port", "0"], "--port must be")):
        done = subprocess.run([sys.executable, "-m", "agentevolver.logview", *args], capture_output=True, text=True,
                              cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr
