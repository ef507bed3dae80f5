"""The run's memory allocator (``AGENTEVOLVER_ALLOCATOR`` in config/backend/cpu.yaml): named choices, a clear
error for a bad one, and the setting in force inside a Ray worker and in every process the launcher starts
(agentevolver/backends/cpu/allocator.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from training_fixture import ask_a_local_ray

from agentevolver.backends.cpu import allocator
from agentevolver.config import compose_config
from agentevolver.errors import ConfigError
from agentevolver.main_ppo import prepare_config
from agentevolver.paths import REPO_ROOT

#: Every variable a choice may set (restored after each test that resolves one into os.environ).
_VARS = (allocator.ALLOCATOR_VAR, "LD_PRELOAD", *allocator.GLIBC_TUNED)

#: Where does a 64 MiB malloc land? glibc serves it with mmap by default (above its largest dynamic mmap
#: threshold, 32 MiB) and from the brk heap when MALLOC_MMAP_THRESHOLD_ was read at process start. Source text,
#: so that a fresh process and a Ray worker run the same code (in the main thread: glibc's main arena).
_PROBE = """
def heap_probe():
    import ctypes, os
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(64 << 20)
    heap = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in open("/proc/self/maps")
            if line.rstrip().endswith("[heap]")]
    libc.free(block)
    return {"in_heap": any(lo <= block < hi for lo, hi in heap),
            "allocator": os.environ.get("AGENTEVOLVER_ALLOCATOR")}
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _cpu_config(*overrides: str):
    return compose_config(["actor_rollout_ref.model.path=tiny-test", "trainer.default_local_dir=/tmp/ae-allocator",
                           *overrides])


def test_each_choice_names_its_variables_and_a_bad_one_names_the_key() -> None:
    assert allocator.allocator_env("default") == {allocator.ALLOCATOR_VAR: "default"}
    assert allocator.allocator_env("glibc-tuned") == {allocator.ALLOCATOR_VAR: "glibc-tuned", **allocator.GLIBC_TUNED}
    with pytest.raises(ConfigError, match=r"AGENTEVOLVER_ALLOCATOR: must be one of default, glibc-tuned, "
                                          r"jemalloc, tcmalloc; got 'mimalloc'"):
        allocator.allocator_env("mimalloc")
    for name in ("jemalloc", "tcmalloc"):
        library = allocator.preload_library(name)
        if library is None:  # not installed here: the error says which package to install
            with pytest.raises(ConfigError, match=rf"{allocator.ALLOCATOR_VAR}: {name} needs .*apt-get install"):
                allocator.allocator_env(name)
        else:  # installed: preloaded first, an LD_PRELOAD already in force kept after it
            assert allocator.allocator_env(name, preload="/x/other.so")["LD_PRELOAD"] == f"{library} /x/other.so"


def test_the_cpu_preset_keeps_glibc_and_a_config_without_the_key_sets_nothing(clean_env) -> None:
    cfg = _cpu_config()
    assert allocator.configured_env(cfg) == {allocator.ALLOCATOR_VAR: "default"}
    assert allocator.resolve_allocator(cfg) == {allocator.ALLOCATOR_VAR: "default"}
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ and "LD_PRELOAD" not in os.environ
    without = _cpu_config(f"~{allocator.ALLOCATOR_KEY}")
    assert allocator.resolve_allocator(without) == {} and allocator.ALLOCATOR_VAR not in without.ray_kwargs.ray_init.runtime_env.env_vars


def test_the_probe_tells_the_allocators_apart() -> None:
    """The control for the worker test below: the same probe in fresh processes, default vs tuned glibc."""
    results = {}
    for name in ("default", "glibc-tuned"):
        env = {k: v for k, v in os.environ.items() if k not in _VARS} | allocator.allocator_env(name)
        code = _PROBE + "import json; print(json.dumps(heap_probe()))"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        results[name] = json.loads(out.stdout)["in_heap"]
    assert results == {"default": False, "glibc-tuned": True}


def test_the_chosen_allocator_is_in_force_inside_a_ray_worker(clean_env) -> None:
    """main_ppo's prepared config gives the workers the tunables (runtime env and inherited environment);
    read back from inside a worker: its variables, and where its large blocks now come from."""
    import ray

    cfg = prepare_config(_cpu_config(f"{allocator.ALLOCATOR_KEY}=glibc-tuned"))
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars[allocator.ALLOCATOR_VAR] == "glibc-tuned"
    assert all(env_vars[k] == v for k, v in allocator.GLIBC_TUNED.items())
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == allocator.GLIBC_TUNED["MALLOC_MMAP_THRESHOLD_"]

    @ray.remote
    def seen() -> dict[str, object]:
        scope: dict[str, object] = {}
        exec(_PROBE, scope)
        return {**scope["heap_probe"](), "threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_")}

    result = ask_a_local_ray(cfg, seen.remote)
    assert result == {"in_heap": True, "allocator": "glibc-tuned",
                      "threshold": allocator.GLIBC_TUNED["MALLOC_MMAP_THRESHOLD_"]}


def test_a_bad_choice_stops_the_launch_naming_the_key_and_the_plan_shows_the_variables() -> None:
    launcher = [sys.executable, str(REPO_ROOT / "launcher.py"), "--conf", "examples/quickstart.yaml", "--dry-run"]
    bad = subprocess.run([*launcher, "--", f"{allocator.ALLOCATOR_KEY}=mimalloc"], cwd=REPO_ROOT,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr + bad.stdout
    assert f"{allocator.ALLOCATOR_KEY}: must be one of" in " ".join((bad.stderr + bad.stdout).split())
    good = subprocess.run([*launcher, "--", f"{allocator.ALLOCATOR_KEY}=glibc-tuned"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    shown = " ".join(good.stdout.split())
    assert "AGENTEVOLVER_ALLOCATOR=glibc-tuned MALLOC_MMAP_THRESHOLD_=1000000000000" in shown
