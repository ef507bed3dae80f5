"""The launcher (``python launcher.py``): services from the config, run record, training, clean shutdown.

Every launch here is the real ``launcher.py`` in a subprocess, starting the real environment service (with
the test environments of ``envs_for_tests``) on free ports. The end-to-end test runs one real
``tiny-test`` training step through ``agentevolver.main_ppo`` next to the env and memory services. The
fast ones replace only the trainer, at the edge, by the stand-in at the bottom of this file (run as
``--target test_launcher``), to check exit codes, Ctrl-C and escalation in seconds. After every launch:
no process carrying the launch's id is alive and the services' ports are free again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import pytest
from env_service_fixture import REPO_ROOT, TESTS_DIR, env_service
from ports import free_port
from training_fixture import training_timeout

from agentevolver.config import load_config
from agentevolver.errors import ConfigError
from agentevolver.launcher.plan import build_plan, split_overrides
from agentevolver.launcher.processes import LAUNCH_ID_ENV
from agentevolver.launcher.record import fill_experiment_name
from agentevolver.launcher.services import fill_placeholders

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
STAND_IN = "LAUNCHER_TEST_TRAINER"


# -- helpers ------------------------------------------------------------------------------------------------

def launcher_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(REPO_ROOT)]), **extra}


def env_args(env_port: int, *more: str) -> list[str]:
    """Launcher arguments that start the env service serving ``lottery`` (from envs_for_tests)."""
    return ["--with-env", "lottery", *more, "--", "env_service.env_type=lottery",
            f"env_service.env_url=http://127.0.0.1:{env_port}",
            "launcher.services.env.extra_args=[--plugin,envs_for_tests,--log-level,warning]",
            "launcher.shutdown_grace_s=20", "launcher.poll_interval_s=0.2"]


def run_launcher(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(QUICKSTART), *args],
                          cwd=cwd, env=launcher_env(**env), capture_output=True, text=True, check=False)


def record_of(cwd: Path, experiment: str = "quickstart") -> dict:
    return json.loads((cwd / "launcher_record" / experiment / "launch.json").read_text())


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def assert_nothing_left(record: dict, ports: list[int]) -> None:
    """No process of this launch is alive (by its launch id, and by the recorded pids); ports are free."""
    launch_id = record["launch_id"]
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.environ().get(LAUNCH_ID_ENV) == launch_id and proc.status() != psutil.STATUS_ZOMBIE:
                left.append((proc.pid, proc.info["cmdline"]))
        except psutil.Error:
            continue
    assert not left, f"processes of the launch still alive: {left}"
    pids = [s["pid"] for s in record.get("services", []) if "pid" in s]
    pids += [record["training"]["pid"]] if "training" in record else []
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert all(port_is_free(port) for port in ports), [port for port in ports if not port_is_free(port)]


# -- plan and config (no processes) -------------------------------------------------------------------------

def test_services_take_their_address_from_the_run_config() -> None:
    plan, _cfg, _settings = build_plan(
        QUICKSTART, ["env_service.env_url=http://127.0.0.1:9123", "memory.base_url=http://localhost:9124",
                     "trainer.experiment_name=exp1"], ["env", "memory", "logview", "llm"], "", "agentevolver.main_ppo")
    services = {svc.name: svc for svc in plan.services}
    assert services["env"].argv[1:] == ("-m", "env_service", "--env", "calc", "--host", "127.0.0.1", "--port", "9123")
    assert services["env"].argv[0] == sys.executable
    assert services["env"].health_url == "http://127.0.0.1:9123/healthz"
    assert (services["memory"].host, services["memory"].port) == ("localhost", 9124)
    # the llm server listens where the LLM roles' `local` endpoint points, serving that endpoint's model name
    llm = services["llm"]
    assert (llm.port, llm.health_url) == (8010, "http://127.0.0.1:8010/healthz")
    assert list(llm.argv).count("smollm2-135m-instruct") == 2
    assert "checkpoints/agentevolver/exp1" in services["logview"].argv
    assert plan.record_dir == (Path.cwd() / "launcher_record" / "exp1").resolve()
    assert plan.training_argv[1:7] == ["-m", "agentevolver.main_ppo", "--config-path", str(plan.record_dir),
                                       "--config-name", "config"]


@pytest.mark.parametrize(
    ("overrides", "services", "envs", "fragment"),
    [
        ([], ["env"], "bfcl", "--with-env bfcl: the training run uses env_service.env_type='calc'"),
        ([], ["nope"], None, "no service launcher.services.nope"),
        (["memory.base_url=http://127.0.0.1:8080"], ["env", "memory"], None, "both use 127.0.0.1:8080"),
        (["launcher.services.env.command=[x,'{pyton}']"], ["env"], None,
         "launcher.services.env.command[1]: unknown placeholder {pyton}"),
        (["trainer.experiment_name=a/b"], [], None, "trainer.experiment_name"),
        (["launcher.services.env.ready_timeout_s=0"], [], None, "launcher.services.env.ready_timeout_s"),
        (["+launcher.services.env.cmd=[x]"], [], None, "launcher.services.env.cmd: unknown key"),
    ],
)
def test_bad_launch_settings_name_the_key(overrides: list[str], services: list[str], envs: str | None,
                                          fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_plan(QUICKSTART, overrides, services, envs)
    assert fragment in str(info.value)


def test_placeholders_and_experiment_name() -> None:
    values = {"host": "h", "port": "1"}
    assert fill_placeholders(["{host}:{port}", '{"json": 1}', "${x}"], values, "k") == ["h:1", '{"json": 1}', "${x}"]
    node = {"a": ["x/${trainer.experiment_name}", 3], "b": {"c": "${trainer.experiment_name}"}, "d": None}
    assert fill_experiment_name(node, "e") == {"a": ["x/e", 3], "b": {"c": "e"}, "d": None}
    assert split_overrides(["a=1", "hydra.run.dir=x", "+hydra/job_logging=none"]) == (
        ["a=1"], ["hydra.run.dir=x", "+hydra/job_logging=none"])


def test_root_config_launcher_section_validates() -> None:
    _cfg, settings = load_config()
    assert set(settings.launcher.services) == {"env", "memory", "logview", "llm"}
    assert settings.launcher.services["env"].url == settings.env_service.env_url


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    done = run_launcher(["--with-env", "--with-memory", "--dry-run", "--",
                         f"env_service.env_url=http://127.0.0.1:{port}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "service env" in done.stdout and f"127.0.0.1:{port}" in done.stdout and "start" in done.stdout
    assert "agentevolver.memory_service" in done.stdout and "agentevolver.main_ppo" in done.stdout
    assert not (tmp_path / "launcher_record").exists()


def test_bad_config_exits_2_before_anything_starts(tmp_path: Path) -> None:
    done = run_launcher(["--with-env", "--", "agent_flow.max_steps=0"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "agent_flow.max_steps" in done.stderr
    assert not (tmp_path / "launcher_record").exists()


# -- launches with real services and a stand-in trainer -----------------------------------------------------

def test_a_service_that_never_becomes_healthy_stops_the_launch(tmp_path: Path) -> None:
    env_port, mem_port = free_port(), free_port()
    started = time.monotonic()
    stuck = ("launcher.services.memory.command=['{python}',-c,'print(\"loading forever\", flush=True); "
             "import time; time.sleep(600)']")
    done = run_launcher([*env_args(env_port, "--with-memory"), f"memory.base_url=http://127.0.0.1:{mem_port}",
                         stuck, "launcher.services.memory.ready_timeout_s=5"], tmp_path, **{STAND_IN: "exit:0"})
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stderr
    log = tmp_path / "launcher_record" / "quickstart" / "logs" / "memory_service.log"
    assert "service 'memory' did not become healthy within 5 s" in done.stderr
    assert f"log: {log}" in done.stderr and "loading forever" in done.stderr
    assert elapsed < 5 + 60 + 20  # the 600 s sleeper was given up on at its deadline, not waited for
    record = record_of(tmp_path)
    assert record["exit_code"] == 3 and "training" not in record
    assert {s["name"]: s["action"] for s in record["services"]} == {"env": "started", "memory": "started"}
    assert_nothing_left(record, [env_port, mem_port])


def test_a_service_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    port = free_port()
    done = run_launcher(["--with", "env", "--", f"env_service.env_url=http://127.0.0.1:{port}",
                         "launcher.services.env.command=['{python}',-c,'import sys; print(\"no such env\"); "
                         "sys.exit(5)']"], tmp_path)
    assert done.returncode == 3
    assert "service 'env' exited with status 5 before it became healthy" in done.stderr
    assert "no such env" in done.stderr
    assert_nothing_left(record_of(tmp_path), [port])


def test_a_port_held_by_another_program_is_named(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_launcher(["--with-env", "--", f"env_service.env_url=http://127.0.0.1:{port}",
                             "launcher.probe_timeout_s=0.5"], tmp_path)
    assert done.returncode == 3
    assert f"service 'env': port {port} on 127.0.0.1 is taken by a program that does not answer" in done.stderr
    assert_nothing_left(record_of(tmp_path), [])


def test_training_exit_code_is_the_launchers_and_services_are_stopped(tmp_path: Path) -> None:
    env_port = free_port()
    done = run_launcher(["--target", "test_launcher", *env_args(env_port), "trainer.experiment_name=exitcode"],
                        tmp_path, **{STAND_IN: "exit:7"})
    assert done.returncode == 7, done.stderr
    record = record_of(tmp_path, "exitcode")
    assert record["exit_code"] == 7 and record["services"][0]["action"] == "started"
    assert record["version"] and "git_revision" in record and "--with-env lottery" in record["command_line"]
    folder = tmp_path / "launcher_record" / "exitcode"
    # the trainer was started from the recorded config, with the overrides composed in and the name filled
    saw = json.loads((folder / "trainer_saw.json").read_text())
    assert saw[saw.index("--config-path") + 1] == str(folder) and saw[saw.index("--config-name") + 1] == "config"
    config = (folder / "config.yaml").read_text()
    assert "${trainer.experiment_name}" not in config
    assert "workspace_id: exitcode" in config and f"env_url: http://127.0.0.1:{env_port}" in config
    assert "default_local_dir: checkpoints/${trainer.project_name}/exitcode" in config
    assert "default_local_dir: checkpoints/agentevolver/exitcode" in (folder / "config.resolved.yaml").read_text()
    assert (folder / "logs" / "env_service.log").is_file()
    assert_nothing_left(record, [env_port])


def test_a_healthy_service_is_reused_and_left_running(tmp_path: Path) -> None:
    with env_service("lottery", tmp_path=tmp_path) as running:
        port = int(running.url.rsplit(":", 1)[1])
        done = run_launcher(["--target", "test_launcher", *env_args(port)], tmp_path, **{STAND_IN: "exit:0"})
        assert done.returncode == 0, done.stderr
        assert "already answers" in done.stderr
        record = record_of(tmp_path)
        assert record["services"] == [{"name": "env", "action": "reused", "url": running.url,
                                       "health_url": f"{running.url}/healthz"}]
        assert running.process.poll() is None  # not stopped by the launcher
        assert_nothing_left(record, [])


@pytest.mark.parametrize("stubborn", [False, True], ids=["graceful", "escalates-to-sigkill"])
def test_ctrl_c_stops_everything_it_started(tmp_path: Path, stubborn: bool) -> None:
    env_port = free_port()
    args = [sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(QUICKSTART), "--target", "test_launcher",
            *env_args(env_port), "launcher.shutdown_grace_s=3"]
    launcher = subprocess.Popen(args, cwd=tmp_path, env=launcher_env(**{STAND_IN: "stubborn" if stubborn else "hang"}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = tmp_path / "launcher_record" / "quickstart" / "trainer_ready"
    while not ready.exists():
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.2)
    children = json.loads(ready.read_text())
    assert all(psutil.pid_exists(pid) for pid in children)
    launcher.send_signal(signal.SIGINT)
    _out, err = launcher.communicate()
    assert launcher.returncode == 130, err
    assert "SIGINT received: shutting down" in err
    assert ("'training' did not stop within launcher.shutdown_grace_s (3 s)" in err) == stubborn
    assert_nothing_left(record_of(tmp_path), [env_port])
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in children)


def test_a_service_that_dies_while_training_runs_is_started_again_within_its_limit(tmp_path: Path) -> None:
    env_port = free_port()
    args = [sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(QUICKSTART), "--target", "test_launcher",
            *env_args(env_port), "launcher.restart_backoff_s=0.2", "launcher.max_restarts=1"]
    launcher = subprocess.Popen(args, cwd=tmp_path, env=launcher_env(**{STAND_IN: "hang"}),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(condition: Callable[[dict], bool]) -> dict:
        while True:
            assert launcher.poll() is None, launcher.communicate()
            with contextlib.suppress(OSError, ValueError):
                record = record_of(tmp_path)
                if condition(record):
                    return record
            time.sleep(0.2)

    try:
        ready = tmp_path / "launcher_record" / "quickstart" / "trainer_ready"
        first = wait_for(lambda record: ready.exists() and "services" in record)["services"][0]["pid"]
        os.kill(first, signal.SIGKILL)
        record = wait_for(lambda record: len(record.get("restarts", [])) == 1)
        restart = record["restarts"][0]
        assert (restart["service"], restart["exit_status"], restart["old_pid"], restart["restarted"]) == (
            "env", 137, first, True)
        assert record["services"][0]["pid"] == restart["pid"] != first and record["services"][0]["restarts"] == 1
        # the launcher saw the restarted service answer (its own probe, so its message is printed too)
        record = wait_for(lambda record: "healthy_after_s" in record["restarts"][0])
        assert httpx.get(f"http://127.0.0.1:{env_port}/healthz", timeout=5).text == "OK"
        os.kill(restart["pid"], signal.SIGKILL)  # a second death: launcher.max_restarts=1 is spent
        record = wait_for(lambda record: len(record.get("restarts", [])) == 2)
        assert record["restarts"][1]["restarted"] is False
        launcher.send_signal(signal.SIGINT)
        _out, err = launcher.communicate()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert "service 'env' exited with status 137 while training runs; starting it again in 0.2 s" in err
    assert "service 'env' is healthy again after" in err
    assert "is not started again (launcher.max_restarts=1 reached)" in err
    assert_nothing_left(record_of(tmp_path), [env_port])


# -- end to end ---------------------------------------------------------------------------------------------

@training_timeout
def test_launcher_trains_through_a_memory_service_outage_and_a_second_launch_says_it_is_done(
        tmp_path: Path, scripted_llm) -> None:
    """Env and memory services started by the launcher, Self-Navigating on (init_train_update: the memory is
    built before step 1, read by every episode, written after every step). The memory service is killed
    after step 1: the launcher starts it again, the episodes meanwhile go without experience (counted) and
    training reaches its last step. Launched again, the finished run stops at once and says so."""
    from memory_service_fixture import task_summariser
    from scripted_openai_server import SCRIPTED_MODEL
    from training_fixture import training_command

    from agentevolver.verl.tracking import read_metrics

    scripted_llm.respond_with(task_summariser)
    env_port, mem_port = free_port(), free_port()
    overrides = training_command(f"http://127.0.0.1:{env_port}", tmp_path)[5:]
    args = [sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", str(QUICKSTART),
            "--with-env", "lottery", "--with-memory", "--",
            *overrides, "trainer.experiment_name=launcher_e2e", "trainer.save_freq=2",
            "exp_mode=init_train_update", "exp_manager.init_exp_max_tasks=2", "memory.workspace_id=ws-launcher",
            f"memory.base_url=http://127.0.0.1:{mem_port}",
            f"llm.endpoints.local.base_url={scripted_llm.base_url}", f"llm.endpoints.local.model={SCRIPTED_MODEL}",
            "launcher.services.env.extra_args=[--plugin,envs_for_tests]", "launcher.restart_backoff_s=0.2",
            f"launcher.services.memory.extra_args=[--data-dir,{tmp_path / 'memory'}]", "launcher.poll_interval_s=0.2"]
    launcher = subprocess.Popen(args, cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        metrics_file = tmp_path / "run" / "metrics.jsonl"
        while not (metrics_file.exists() and metrics_file.read_text().strip()):  # step 1 is done
            assert launcher.poll() is None, launcher.communicate()
            time.sleep(0.2)
        memory_pid = next(s["pid"] for s in record_of(tmp_path, "launcher_e2e")["services"] if s["name"] == "memory")
        os.kill(memory_pid, signal.SIGKILL)
        stdout, stderr = launcher.communicate()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, (stdout + stderr)[-8000:]
    folder = tmp_path / "launcher_record" / "launcher_e2e"
    record = record_of(tmp_path, "launcher_e2e")
    assert record["exit_code"] == 0
    assert [(s["name"], s["action"]) for s in record["services"]] == [("env", "started"), ("memory", "started")]
    assert [(r["service"], r["exit_status"], r["restarted"]) for r in record["restarts"]] == [("memory", 137, True)]
    steps = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert sorted(steps) == [1, 2]  # trained to the last step through the outage
    assert steps[1]["exp/injected_share"] > 0 and steps[1]["exp/retrieve_errors"] == 0
    assert "exp/retrieve_errors" in steps[2] and steps[2]["episode/failed"] == 0  # no experience is no failure
    assert (tmp_path / "run" / "rollouts" / "step_2.jsonl").is_file()
    assert "workspace_id: ws-launcher" in (folder / "config.yaml").read_text()
    assert (folder / "hydra" / ".hydra" / "config.yaml").is_file()
    assert (folder / "logs" / "env_service.log").stat().st_size > 0
    assert (folder / "logs" / "memory_service.log").stat().st_size > 0
    assert_nothing_left(record, [env_port, mem_port])

    # the same launch again: the run is finished, so it says so and starts nothing (its record stays)
    launch_json = (folder / "launch.json").read_text()
    again = subprocess.run(args, cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "already trained to step 2 of trainer.total_training_steps=2" in again.stderr
    assert "trainer.resume_mode=disable" in again.stderr and "starting" not in again.stderr
    assert (folder / "launch.json").read_text() == launch_json
    assert sorted(read_metrics(tmp_path / "run" / "metrics.jsonl")) == [1, 2]  # no step past the end


# -- the stand-in trainer (``python -m test_launcher``) -----------------------------------------------------

def _stand_in_trainer(argv: list[str]) -> int:
    """Plays ``agentevolver.main_ppo`` for the fast tests: records its arguments, then does what
    ``$LAUNCHER_TEST_TRAINER`` says: ``exit:N``; ``hang`` (starts a child in its group and one that leaves
    the session, then waits); ``stubborn`` (the same, ignoring SIGINT/SIGTERM, so only SIGKILL stops it)."""
    mode = os.environ[STAND_IN]
    folder = Path(argv[argv.index("--config-path") + 1])
    (folder / "trainer_saw.json").write_text(json.dumps(argv))
    if mode.startswith("exit:"):
        return int(mode.split(":", 1)[1])
    if mode == "stubborn":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "time.sleep(600)" if mode == "stubborn" else "import time; time.sleep(600)"]
    children = [subprocess.Popen(sleeper), subprocess.Popen(sleeper, start_new_session=True)]
    (folder / "trainer_ready").write_text(json.dumps([child.pid for child in children]))
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(_stand_in_trainer(sys.argv[1:]))
