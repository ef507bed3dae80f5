"""The monkeypatches of agentevolver.verl.patches: every guard passes on the installed verl, a changed verl
trips them, and a tripped guard stops ``python -m agentevolver.main_ppo`` on the driver before Ray starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import verl
from training_fixture import REPO_ROOT, training_timeout

from agentevolver.verl import patches


def test_every_guard_passes_on_the_installed_verl() -> None:
    patches.check_all(cpu=True)
    assert patches.rollout_is_registered()  # the plugin put the hf adapter in verl's table (patch 3)
    assert patches.apply_rollout() is False  # idempotent


def test_the_rollout_guard_rejects_a_changed_table() -> None:
    not_a_dict = types.ModuleType("base")
    not_a_dict._ROLLOUT_REGISTRY = [("vllm", "async")]
    with pytest.raises(patches.VerlChangedError, match="no longer a dict"):
        patches.apply_rollout(not_a_dict)


def test_the_rollout_guard_rejects_a_lookup_that_no_longer_reads_the_table(tmp_path: Path) -> None:
    source = tmp_path / "fake_base.py"
    source.write_text("_ROLLOUT_REGISTRY = {}\n\ndef get_rollout_class(rollout_name, mode):\n"
                      "    return ROLLOUTS.lookup(rollout_name, mode)\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_base", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(patches.VerlChangedError, match="no longer reads"):
        patches.apply_rollout(module)
    assert module._ROLLOUT_REGISTRY == {}  # nothing written into a table verl would ignore


@training_timeout
def test_a_tripped_guard_stops_the_run_on_the_driver(tmp_path: Path) -> None:
    """A verl whose rollout lookup changed (installed before anything else by a sitecustomize): the entry
    point exits 2 naming verl's version and the patch, with no traceback and without starting Ray."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent("""
        import verl.workers.rollout.base as base

        def get_rollout_class(rollout_name, mode):
            return base.ROLLOUTS.lookup(rollout_name, mode)

        base.get_rollout_class = get_rollout_class
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(REPO_ROOT)])}
    done = subprocess.run([sys.executable, "-m", "agentevolver.main_ppo", "--config-name", "quickstart",
                           "actor_rollout_ref.model.path=tiny-test", f"trainer.default_local_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2, (done.stdout + done.stderr)[-4000:]
    assert f"verl {verl.__version__} does not match AgentEvolver's patch 3" in done.stderr
    assert "Traceback" not in done.stderr
    assert "Ray instance" not in done.stdout + done.stderr and "TaskRunner" not in done.stdout + done.stderr
