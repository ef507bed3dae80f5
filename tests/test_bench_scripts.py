"""Smoke runs of the load benchmarks (bench/env_scale.py, bench/memory_http.py) with their ``--small`` sizes.

Each script runs for real through its entry point (it starts the real services), so a change that breaks
one fails here instead of at the next measurement. No timing is asserted: the numbers belong to
docs/benchmarks.md, measured on a machine as idle as can be had.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("script", "expected"), [
    ("env_scale.py", ["live instances", "MiB / instance", "p99 ms", "service process tree"]),
    ("memory_http.py", ["in-process", "HTTP - in-process", "grouped", "embed", "index", "JSON"]),
])
def test_bench_script_runs_small(script: str, expected: list[str]) -> None:
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / script), "--small"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in (*expected, "load average"):
        assert text in done.stdout, done.stdout


def test_allocator_bench_runs_small() -> None:
    """bench/allocator.py: two allocator settings in fresh processes, the update workload, tiny sizes."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "allocator.py"), "--small", "--repeats", "1",
                           "--model", "tiny-test", "--allocators", "glibc-tuned", "--workloads", "update"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("update", "default", "glibc-tuned", "wall vs default", "load"):
        assert text in done.stdout, done.stdout


def test_mkl_cpu_bench_runs_small() -> None:
    """bench/mkl_cpu.py: the update under MKL as shipped and with its Intel kernels, in fresh processes, tiny-test,
    one group (skipped where torch has no MKL vendor check to answer or there is no C compiler)."""
    from agentevolver.backends.cpu.mkl_cpu import mkl_asks_vendor, shim_library

    if not mkl_asks_vendor() or shim_library() is None:
        pytest.skip("torch does not export MKL's vendor check here, or no C compiler (cc)")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "mkl_cpu.py"), "--repeats", "1",
                           "--model", "tiny-test", "--groups", "1"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("vendor / intel", "checkpointing", "floor", "load"):
        assert text in done.stdout, done.stdout


def test_omp_wait_policy_bench_runs_small() -> None:
    """bench/omp_wait_policy.py: both workloads under both policies in fresh processes, tiny-test, one copy."""
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "omp_wait_policy.py"), "--repeats", "1",
                           "--model", "tiny-test", "--together", "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for text in ("decode", "update", "default", "passive", "vs default", "load"):
        assert text in done.stdout, done.stdout


def test_startup_profile_reads_milestones_from_ray_prefixed_lines() -> None:
    """bench/startup_profile.py names each process by the actor its pid later prints as, and finds the step rows
    (coloured or not) but not the progress bar. Its runs are training runs, which the suite already has plenty of:
    only the parser is run here."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from startup_profile import milestones

    lines = [
        (1.0, "2026-12-05 13:22:11,884\tINFO worker.py:2029 -- Started a local Ray instance."),
        (2.0, "\x1b[36m(pid=5601)\x1b[0m INFO:2026-12-05 13:22:19,004:Platform override from VERL_PLATFORM: cpu"),
        (3.0, "(TaskRunner pid=5601) Size of train dataloader: 4"),
        (4.0, "(pid=5729) INFO: Platform override"),
        (5.0, "(WorkerDict pid=5729) After FSDP, memory allocated (GB): 0.00"),
        (6.0, "(AgentLoopWorker pid=5968) Using dataset class: RLHFDataset"),
        (7.0, "Training Progress:  50%|#####     | 1/2 [00:05<00:05]"),
        (8.0, "\x1b[36m(TaskRunner pid=5601)\x1b[0m  1/2     0.562       56%"),
        (9.5, "(TaskRunner pid=5601)  2/2     0.600       60%"),
    ]
    marks = milestones(lines, exit_s=12.0, step_times={1: 3.0, 2: 1.5})
    assert marks == {"ray up": 1.0, "TaskRunner up": 2.0, "WorkerDict up": 4.0, "model in FSDP": 5.0,
                     "step 1 starts (est.)": 5.0, "AgentLoopWorker up": 6.0, "step 1": 8.0, "step 2": 9.5,
                     "exit": 12.0}


def test_startup_profile_labels_processes_by_actor_and_ray_daemon() -> None:
    """The CPU table's rows: an actor by its class whatever method it runs, Ray's daemons by their program."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from startup_profile import process_label

    assert process_label(["ray::WorkerDict.actor_rollout_update_actor"], "python") == "ray::WorkerDict"
    assert process_label(["ray::HFRolloutServer"], "python") == "ray::HFRolloutServer"
    assert process_label(["ray::IDLE"], "python") == "ray::IDLE"
    assert process_label(["/venv/lib/ray/core/src/ray/gcs/gcs_server", "--port=1"], "gcs_server") == "ray gcs_server"
    assert process_label(["python", "-u", "/venv/lib/ray/dashboard/agent.py", "--node-ip-address=x"],
                         "python") == "ray dashboard agent"
    assert process_label(["python", "-m", "agentevolver.main_ppo", "--config-name", "quickstart"],
                         "python") == "driver (main_ppo)"
    assert process_label(["sleep", "1"], "sleep") == "sleep"


def test_prompt_lookup_bench_replays_a_dump(tmp_path: Path) -> None:
    """One episode whose generated 3, 4 copy the prompt's 1, 2, 3, 4: a 2-token draft (3, 4) matches, and the pass
    adds its own token (9): 3 tokens in 1 pass; the environment's tokens (mask 0) only extend the context."""
    dump = tmp_path / "step_1.jsonl"
    dump.write_text(json.dumps({"prompt_ids": [1, 2, 3, 4, 1, 2], "response_ids": [3, 4, 9, 7, 7],
                                "response_mask": [1, 1, 1, 0, 0]}) + "\n")
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "prompt_lookup.py"), str(dump), "--model",
                           "tiny-test", "--dtype", "float32", "--rows", "2", "--draft", "2", "--repeats", "1"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if line.strip("│ ").startswith("2 "))
    assert [cell.strip() for cell in row.strip("│").split("│")][:4] == ["2", "3", "1", "3.00"], row
    missing = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "prompt_lookup.py"), str(tmp_path / "no.jsonl")],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert missing.returncode != 0 and "no such dump file" in missing.stdout + missing.stderr
