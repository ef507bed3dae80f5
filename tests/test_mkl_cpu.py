"""MKL's kernels on an AMD CPU (``AGENTEVOLVER_MKL_CPU`` in config/backend/cpu.yaml): the choice per CPU, a clear
error for a bad one, the preloaded library answering MKL's vendor check in a fresh process and inside a Ray worker,
and the same attention output with MKL's other kernels (agentevolver/backends/cpu/mkl_cpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from training_fixture import ask_a_local_ray

from agentevolver.backends.cpu import mkl_cpu
from agentevolver.backends.cpu.precision import cpu_field
from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config

ZEN4 = frozenset({"avx512f", "avx512_bf16"})
ZEN3 = frozenset({"avx2", "fma"})

needs_mkl_and_cc = pytest.mark.skipif(
    not mkl_cpu.mkl_asks_vendor() or mkl_cpu.shim_library() is None,
    reason="torch does not export MKL's vendor check here, or there is no C compiler (cc) to build the library")

#: What a process sees: the code branch MKL (torch's own copy) picked for this CPU (0: its generic kernels, which
#: it picks on any AMD CPU; above 0: a branch for the CPU's features), and a bf16 flash attention's forward and
#: backward (the update's attention call) on fixed inputs.
_PROBE = """
def mkl_probe():
    import ctypes, torch
    from pathlib import Path
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 300, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mask = torch.ones(300, 300, dtype=torch.bool).tril()
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.float().square().sum().backward()
    return {"branch": lib.mkl_serv_cpu_detect(),
            "out": out.float().flatten()[::97].tolist(), "grad": q.grad.float().flatten()[::97].tolist()}
"""


@pytest.fixture
def clean_env() -> Iterator[None]:
    """No preload before the test, and this process's environment as it was after it (prepare_config sets
    variables in os.environ for the processes it would start, which later tests of this worker must not get)."""
    saved = dict(os.environ)
    os.environ.pop("LD_PRELOAD", None)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_each_choice_decides_by_vendor_flags_and_dtype_and_a_bad_one_names_the_key() -> None:
    assert mkl_cpu.decide("auto", vendor="AuthenticAMD", flags=ZEN4, bf16=True)[0] is True
    assert mkl_cpu.decide("auto", vendor="AuthenticAMD", flags=ZEN4, bf16=False)[0] is False  # fp32: not measured
    assert mkl_cpu.decide("auto", vendor="AuthenticAMD", flags=ZEN3, bf16=True)[0] is False  # no bf16 kernels
    assert mkl_cpu.decide("auto", vendor="GenuineIntel", flags=ZEN4, bf16=True)[0] is False  # Intel's already
    assert mkl_cpu.decide("vendor", vendor="AuthenticAMD", flags=ZEN4, bf16=True)[0] is False
    assert mkl_cpu.decide("intel", vendor="GenuineIntel", flags=ZEN3, bf16=False)[0] is True
    with pytest.raises(ConfigError, match=r"AGENTEVOLVER_MKL_CPU: must be one of auto, vendor, intel; got 'amd'"):
        mkl_cpu.decide("amd", vendor="AuthenticAMD", flags=ZEN4, bf16=True)


def test_a_bad_choice_stops_main_ppos_config_naming_the_key(clean_env) -> None:
    cfg = compose_config(["actor_rollout_ref.model.path=tiny-test", f"{mkl_cpu.MKL_CPU_KEY}=amd"])
    with pytest.raises(ConfigError, match=r"env_vars.AGENTEVOLVER_MKL_CPU: must be one of auto, vendor, intel"):
        prepare_config(cfg)


def test_vendor_preloads_nothing(clean_env) -> None:
    cfg = prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test", "trainer.default_local_dir=/tmp/ae-mkl",
                                         f"{mkl_cpu.MKL_CPU_KEY}=vendor"]))
    assert "LD_PRELOAD" not in cfg.ray_kwargs.ray_init.runtime_env.env_vars and "LD_PRELOAD" not in os.environ


@needs_mkl_and_cc
def test_the_library_answers_mkls_vendor_check_and_attention_stays_the_same(clean_env) -> None:
    """A fresh process without and with the preload: MKL picks a branch for the CPU's features (on an AMD CPU, its
    generic one without), and the bf16 flash attention's output and gradient agree to bf16 rounding (the
    products are exact; sums may reorder)."""
    library = mkl_cpu.shim_library()
    seen = {}
    for name, env in (("as shipped", dict(os.environ)), ("preloaded", {**os.environ, "LD_PRELOAD": str(library)})):
        code = _PROBE + "import json; print(json.dumps(mkl_probe()))"
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        seen[name] = json.loads(done.stdout.splitlines()[-1])
    assert seen["preloaded"]["branch"] > 0
    if cpu_field("vendor_id") == "AuthenticAMD":  # the premise: MKL as shipped runs its generic kernels on AMD
        assert seen["as shipped"]["branch"] == 0
    for field in ("out", "grad"):
        for a, b in zip(seen["as shipped"][field], seen["preloaded"][field], strict=True):
            assert abs(a - b) <= 1e-2 * max(1.0, abs(a)), (field, a, b)


@needs_mkl_and_cc
def test_intel_is_in_force_inside_a_ray_worker(clean_env) -> None:
    """main_ppo's prepared config gives the workers the preload (runtime env and inherited environment), read back
    from inside a worker through torch's MKL, after the allocator's own variables."""
    import ray

    cfg = prepare_config(compose_config(["actor_rollout_ref.model.path=tiny-test", "trainer.default_local_dir=/tmp/ae-mkl",
                                         f"{mkl_cpu.MKL_CPU_KEY}=intel"]))
    library = str(mkl_cpu.shim_library())
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.LD_PRELOAD.split()[-1] == library
    assert os.environ["LD_PRELOAD"].split()[-1] == library

    @ray.remote
    def seen() -> dict[str, object]:
        scope: dict[str, object] = {}
        exec(_PROBE, scope)
        return {"branch": scope["mkl_probe"]()["branch"], "choice": os.environ.get(mkl_cpu.MKL_CPU_VAR)}

    result = ask_a_local_ray(cfg, seen.remote)
    assert result["choice"] == "intel" and result["branch"] > 0
