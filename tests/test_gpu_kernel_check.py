"""The GPU kernel check (tools/gpu_kernel_check.py) keeps working where it is meant to run.

The GPU machine it is written for has torch, transformers and numpy, but not verl, Ray, vLLM, tensordict,
pydantic, omegaconf or hydra. Here those are installed, so every subprocess below gets a ``sitecustomize``
that makes them unimportable (``sys.modules[name] = None``: ``import`` raises ModuleNotFoundError and
``importlib.util.find_spec`` answers None, as for a package that is not installed) and records at exit that
the block held. Then:

* the dry run (``--device cpu``: every check on CPU) passes through the real entry point,
  ``bash scripts/gpu_check.sh --kernels``, and its printed and JSON reports say what each check measured;
* the check's module closure imports without those packages (a fast, precise failure for a new import);
* a failing check makes the run exit 1 with a FAIL line; asking for CUDA where there is none exits 2;
* on a CUDA machine (``gpu`` marker), the check passes on the GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentevolver.paths import REPO_ROOT

#: What the GPU machine lacks (and this project's other code imports).
MISSING_ON_GPU_MACHINE = ("verl", "vllm", "ray", "tensordict", "fastapi", "starlette", "uvicorn", "hydra",
                          "omegaconf", "pydantic", "pydantic_core", "tenacity", "flash_attn")
CHECK_LINES = ("generator float32", "generator bfloat16", "shared prompt float32", "shared prompt bfloat16", "adca")


@pytest.fixture
def blocked_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Environment for a subprocess in which :data:`MISSING_ON_GPU_MACHINE` cannot be imported, and the file
    where it records, at exit, whether the block held."""
    site = tmp_path / "site"
    site.mkdir()
    record = tmp_path / "blocked.json"
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import atexit, json, sys
        BLOCKED = {MISSING_ON_GPU_MACHINE!r}
        for name in BLOCKED:
            sys.modules[name] = None

        def _record():
            held = [name for name in BLOCKED if name in sys.modules and sys.modules[name] is None]
            with open({str(record)!r}, "w") as out:
                json.dump({{"held": held, "agentevolver": sorted(n for n in sys.modules if n.startswith("agentevolver"))}}, out)

        atexit.register(_record)
    """))
    env = {**os.environ, "PYTHONPATH": str(site), "AGENTEVOLVER_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return env, record


def _held(record: Path) -> dict:
    data = json.loads(record.read_text())
    assert data["held"] == list(MISSING_ON_GPU_MACHINE), "the import block did not hold in the subprocess"
    return data


def test_dry_run_through_the_entry_point(tmp_path: Path, blocked_env: tuple[dict[str, str], Path]) -> None:
    env, record = blocked_env
    report = tmp_path / "kernel_report.json"
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--kernels", "--device", "cpu", "--threads", "1",
         "--report", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("[gpu-kernel-check] cpu (") and "dry run" in lines[0] and "transformers" in lines[0]
    assert [line.split(":")[0].strip() for line in lines[1:6]] == [f"ok   {name}" for name in CHECK_LINES]
    assert lines[-2] == f"report: {report}" and lines[-1] == "GPU kernel check: PASS"

    data = json.loads(report.read_text())
    assert data["pass"] is True and data["device"] == "cpu" and data["torch"] and data["transformers"]
    checks = {check["name"]: check for check in data["checks"]}
    assert list(checks) == list(CHECK_LINES) and all(check["ok"] for check in checks.values())
    generator = checks["generator bfloat16"]["measured"]
    assert generator["requests"] == 20 and generator["equal"] + generator["parted_at_near_tie"] == 20
    assert generator["cached_prefix_tokens"] > 0 and generator["stats"]["batched"]["batches"] == 1
    assert checks["generator float32"]["measured"]["equal"] == 20  # fp32: token for token, no near-tie needed
    shared = checks["shared prompt float32"]["measured"]
    assert shared["rows"] < shared["samples"] and shared["max_grad_rel_diff"] <= 1e-4
    assert shared["leaking_mask_max_logprob_diff"] > 1.0  # the control sees a leak
    assert checks["adca"]["measured"]["cases"] == 33 and checks["adca"]["measured"]["max_abs_diff"]["oracle"] < 1e-4

    loaded = _held(record)["agentevolver"]
    for module in ("agentevolver.backends.cpu.generator", "agentevolver.verl.shared_prefix.layout",
                   "agentevolver.module.adv_processor.adca_grpo"):
        assert module in loaded


def test_module_closure_imports_without_what_the_gpu_machine_lacks(
        tmp_path: Path, blocked_env: tuple[dict[str, str], Path]) -> None:
    env, record = blocked_env
    code = ("import tools.gpu_kernel_check as check\n"
            "groups, adca, oracle = check.adca_modules()\n"
            "from agentevolver.backends.cpu.generator import TokenOutput\n"
            "assert TokenOutput.__module__ == 'agentevolver.backends.cpu.generator', TokenOutput.__module__\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    _held(record)


def test_a_failing_check_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from tools import gpu_kernel_check

    def broken(device: object, seed: int) -> None:
        raise RuntimeError("index tensor on the wrong device")

    monkeypatch.setattr(gpu_kernel_check, "check_adca", broken)
    report = tmp_path / "report.json"
    assert gpu_kernel_check.main(["--device", "cpu", "--only", "adca", "--report", str(report)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  FAIL adca: raised RuntimeError: index tensor on the wrong device")
    assert lines[-1] == "GPU kernel check: FAIL (adca)"
    data = json.loads(report.read_text())
    assert data["pass"] is False and "Traceback" in data["checks"][0]["measured"]["traceback"]


def test_asking_for_cuda_without_it_is_a_clear_error(tmp_path: Path, blocked_env: tuple[dict[str, str], Path]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    env, _ = blocked_env
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--kernels", "--report",
                           str(tmp_path / "r.json")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "sees no CUDA device; --device cpu" in done.stderr


@pytest.mark.gpu
def test_kernel_check_on_cuda(tmp_path: Path, blocked_env: tuple[dict[str, str], Path]) -> None:
    env, record = blocked_env
    report = tmp_path / "kernel_report.json"
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--kernels", "--report", str(report)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-8000:]
    assert done.stdout.splitlines()[-1] == "GPU kernel check: PASS"
    data = json.loads(report.read_text())
    assert data["device"].startswith("cuda") and data["pass"] is True
    _held(record)
