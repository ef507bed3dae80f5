"""The CPU backend's ``auto`` compute dtype: bf16 where the CPU has native bf16, fp32 elsewhere, decided once
on the driver before verl reads the keys (agentevolver/backends/cpu/precision.py)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from training_fixture import ask_a_local_ray

from agentevolver.backends.cpu import precision, threads
from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.verl.cpu.rollout_server import dtype_name

ZEN4 = "fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 avx_vnni"
SAPPHIRE_RAPIDS = "avx2 avx512f avx512_bf16 amx_tile amx_bf16 amx_int8"
OLD_XEON = "sse2 avx2 avx512f avx512_vnni"


@pytest.mark.parametrize(("flags", "expected"), [
    (ZEN4, "avx512_bf16"), (SAPPHIRE_RAPIDS, "amx_bf16"), (OLD_XEON, None), ("", None),
])
def test_bf16_support_is_read_from_the_cpu_flags(flags: str, expected: str | None) -> None:
    assert precision.cpu_bf16_support(flags.split()) == expected
    assert precision.resolve_dtype("auto", flags=flags.split(), speedup=3.0) == ("bf16" if expected else "fp32")
    assert precision.resolve_dtype("fp32", flags=flags.split()) == "fp32"  # an explicit dtype is kept


@pytest.mark.parametrize(("speedup", "dtype"), [(4.06, "bf16"), (1.1, "bf16"), (1.05, "fp32"), (0.58, "fp32")])
def test_a_bf16_flag_is_not_enough_bf16_must_measure_faster(speedup: float, dtype: str) -> None:
    """Measured: an AMD EPYC with avx512_bf16 ran bf16 matrix products 4.06x faster than fp32; an Intel Xeon VM
    listing avx512_bf16 (no AMX) ran them at 0.58x, and every stage of a step was slower in bf16."""
    assert precision.resolve_dtype("auto", flags=ZEN4.split(), speedup=speedup) == dtype
    assert precision.resolve_dtype("auto", flags=OLD_XEON.split(), speedup=speedup) == "fp32"  # no flag: no probe


def test_the_probe_is_measured_once_per_machine_and_kept(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AGENTEVOLVER_CACHE_DIR", str(tmp_path))
    calls: list[float] = []
    real = precision._measure_speedup

    def measure() -> float:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(precision, "_measure_speedup", measure)
    precision.bf16_speedup.cache_clear()
    try:
        first = precision.bf16_speedup()
        assert first > 0 and len(calls) == 1  # a real measurement of this CPU
        precision.bf16_speedup.cache_clear()  # a new process: reads the kept result, measures nothing
        assert precision.bf16_speedup() == first and len(calls) == 1
        kept = json.loads((tmp_path / "cpu_bf16_probe.json").read_text())
        assert [entry["speedup"] for entry in kept.values()] == [first]
        assert precision._probe_key() in kept  # keyed by CPU model, flags, torch version and threads
    finally:
        precision.bf16_speedup.cache_clear()


def test_the_machine_flags_come_from_cpuinfo_once(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {OLD_XEON}\n\nprocessor\t: 1\nflags\t\t: {OLD_XEON}\n")
    monkeypatch.setattr(precision, "_CPUINFO", cpuinfo)
    _clear_cpuinfo()
    try:
        assert precision.cpu_bf16_support() is None
        cpuinfo.write_text(f"flags\t\t: {ZEN4}\n")
        assert precision.cpu_bf16_support() is None  # read once per process
        _clear_cpuinfo()
        assert precision.cpu_bf16_support() == "avx512_bf16"
        monkeypatch.setattr(precision, "_CPUINFO", tmp_path / "missing")
        _clear_cpuinfo()
        assert precision.cpu_bf16_support() is None  # not Linux: no bf16 assumed
    finally:
        _clear_cpuinfo()


def _clear_cpuinfo() -> None:
    precision._cpuinfo.cache_clear()
    precision._machine_flags.cache_clear()


def _cpu_config(*overrides: str):
    return compose_config(["actor_rollout_ref.model.path=tiny-test", "trainer.default_local_dir=/tmp/ae-precision",
                           *overrides])


@pytest.mark.parametrize(("flags", "dtype"), [(ZEN4, "bf16"), (OLD_XEON, "fp32")])
def test_the_cpu_preset_resolves_auto_for_actor_reference_and_rollout(flags: str, dtype: str) -> None:
    cfg = _cpu_config()
    assert {OmegaConf.select(cfg, key) for key in precision.AUTO_DTYPE_KEYS} == {"auto"}
    chosen = precision.resolve_auto_dtypes(cfg, flags=flags.split(), speedup=2.0)
    assert chosen == dict.fromkeys(precision.AUTO_DTYPE_KEYS, dtype)
    assert [OmegaConf.select(cfg, key) for key in precision.AUTO_DTYPE_KEYS] == [dtype] * 3
    # reductions and buffers stay fp32 (fp32 master weights and gradient reductions)
    assert cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype == "fp32"


def test_an_explicit_dtype_is_not_touched() -> None:
    cfg = _cpu_config("actor_rollout_ref.rollout.dtype=float32",
                      "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32")
    chosen = precision.resolve_auto_dtypes(cfg, flags=ZEN4.split(), speedup=2.0)
    assert chosen == {"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype": "bf16"}
    assert cfg.actor_rollout_ref.rollout.dtype == "float32"


def test_prepare_config_resolves_auto_on_the_driver() -> None:
    cfg = prepare_config(_cpu_config())
    expected = precision.resolve_dtype("auto")  # this machine's flag and measured speed-up
    flag = precision.cpu_bf16_support()
    assert expected == ("bf16" if flag and precision.bf16_speedup() >= precision.MIN_BF16_SPEEDUP else "fp32")
    assert [OmegaConf.select(cfg, key) for key in precision.AUTO_DTYPE_KEYS] == [expected] * 3
    assert precision.describe(cfg) == {"cpu_bf16_flag": flag, "bf16_speedup": precision.bf16_speedup() if flag else None,
                                       "dtypes": dict.fromkeys(precision.AUTO_DTYPE_KEYS, expected)}


def test_auto_off_the_cpu_is_refused_with_the_key_named() -> None:
    cfg = _cpu_config("trainer.device=cuda")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.fsdp_config\.mixed_precision\.param_dtype: "
                                          r"'auto' .* needs trainer.device=cpu .* set bf16 or fp32"):
        prepare_config(cfg)
    assert precision.describe(cfg) is None


def test_the_hf_rollout_takes_auto_and_names_the_choices() -> None:
    assert dtype_name("bf16") == "bfloat16" and dtype_name("float32") == "float32"
    assert dtype_name("auto") == ("bfloat16" if precision.resolve_dtype("auto") == "bf16" else "float32")
    with pytest.raises(ValueError, match=r"rollout\.dtype must be auto, float32, bfloat16 or float16"):
        dtype_name("int8")


def test_worker_threads_auto_is_the_usable_cores_and_a_number_is_kept() -> None:
    cfg = _cpu_config()
    assert OmegaConf.select(cfg, threads.THREADS_KEY) == "auto"
    assert threads.resolve_auto_threads(cfg, cores=6) == "6" and OmegaConf.select(cfg, threads.THREADS_KEY) == "6"
    given = _cpu_config(f"{threads.THREADS_KEY}=3")  # Hydra makes it an int; Ray wants strings
    assert threads.resolve_auto_threads(given) == "3" and OmegaConf.select(given, threads.THREADS_KEY) == "3"
    with pytest.raises(ConfigError, match=r"OMP_NUM_THREADS: must be auto or a whole number of threads >= 1; got 'all'"):
        threads.resolve_auto_threads(_cpu_config(f"{threads.THREADS_KEY}=all"))


def test_worker_threads_auto_shares_the_cores_in_async_training() -> None:
    """The rollout server and the update compute side by side there: half the cores each, at least one."""
    assert threads.resolve_auto_threads(_cpu_config(), cores=6, side_by_side=2) == "3"
    assert threads.resolve_auto_threads(_cpu_config(), cores=1, side_by_side=2) == "1"
    assert threads.resolve_auto_threads(_cpu_config(f"{threads.THREADS_KEY}=4"), cores=6, side_by_side=2) == "4"
    from agentevolver.main_ppo import _resolve_worker_threads

    cfg = _cpu_config("trainer.mode=async")
    _resolve_worker_threads(cfg)
    assert OmegaConf.select(cfg, threads.THREADS_KEY) == str(max(1, threads.usable_cores() // 2))


def test_the_wait_policy_auto_keeps_libgomps_spin_unless_the_environment_names_one() -> None:
    """``auto``: ACTIVE with libgomp's one-team spin count in every Ray worker (a process holding more OpenMP
    threads than cores, the worker hosting the rollout server, would otherwise spin 1k iterations and decode
    30-40% slower); a policy in the driver's environment (the test suite's PASSIVE) is left to the workers to
    inherit; a given policy is passed on; anything else is named."""
    env_key = "ray_kwargs.ray_init.runtime_env.env_vars"
    cfg = _cpu_config()
    assert OmegaConf.select(cfg, threads.WAIT_POLICY_KEY) == "auto"
    assert threads.resolve_wait_policy(cfg, environ={}) == "ACTIVE"
    assert OmegaConf.select(cfg, env_key)["OMP_WAIT_POLICY"] == "ACTIVE"
    assert OmegaConf.select(cfg, env_key)["GOMP_SPINCOUNT"] == threads.SPIN_COUNT == "300000"
    inherited = _cpu_config()
    assert threads.resolve_wait_policy(inherited, environ={"OMP_WAIT_POLICY": "PASSIVE"}) == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in OmegaConf.select(inherited, env_key)
    assert "GOMP_SPINCOUNT" not in OmegaConf.select(inherited, env_key)
    own_count = _cpu_config()
    threads.resolve_wait_policy(own_count, environ={"GOMP_SPINCOUNT": "1000000"})  # the environment's count stays
    assert "GOMP_SPINCOUNT" not in OmegaConf.select(own_count, env_key)
    given = _cpu_config(f"{threads.WAIT_POLICY_KEY}=passive")
    assert threads.resolve_wait_policy(given, environ={}) == "PASSIVE"
    assert OmegaConf.select(given, env_key)["OMP_WAIT_POLICY"] == "PASSIVE"
    with pytest.raises(ConfigError, match=r"OMP_WAIT_POLICY: must be auto, ACTIVE or PASSIVE; got 'spin'"):
        threads.resolve_wait_policy(_cpu_config(f"{threads.WAIT_POLICY_KEY}=spin"), environ={})


def test_the_ray_workers_get_every_usable_core() -> None:
    """Ray gives a worker whose actor names no num_cpus (verl's) OMP_NUM_THREADS=1 unless the run says
    otherwise: the prepared config's runtime env reaches the worker, read back from inside one."""
    import ray

    cfg = prepare_config(_cpu_config())

    @ray.remote
    class Probe:
        def threads(self) -> tuple[str | None, int]:
            import os

            import torch

            return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()

    env, used = ask_a_local_ray(cfg, lambda: Probe.remote().threads.remote())
    assert (env, used) == (str(threads.usable_cores()), threads.usable_cores())


def test_runtime_env_numbers_become_text_and_other_values_are_named() -> None:
    """Ray refuses non-string runtime-env variables with a traceback inside ray.init; Hydra reads `=2` as 2."""
    key = "ray_kwargs.ray_init.runtime_env.env_vars"
    cfg = prepare_config(_cpu_config(f"+{key}.MY_LIMIT=2", f"+{key}.MY_FLAG=true"))
    assert (cfg.ray_kwargs.ray_init.runtime_env.env_vars.MY_LIMIT,
            cfg.ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG) == ("2", "true")
    with pytest.raises(ConfigError, match=rf"{key}\.MY_LIST: must be a string, number or boolean; got \[1, 2\]"):
        prepare_config(_cpu_config(f"+{key}.MY_LIST=[1,2]"))
