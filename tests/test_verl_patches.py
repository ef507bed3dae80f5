"""The patches and seams of agentevolver.verl.patches: every guard passes on the installed verl, a changed verl
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


def _module_from_source(tmp_path: Path, name: str, source: str) -> types.ModuleType:
    """A module loaded from a file (so that a guard can read its source), standing in for a changed verl module."""
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rollout_guard_rejects_a_lookup_that_no_longer_reads_the_table(tmp_path: Path) -> None:
    module = _module_from_source(tmp_path, "fake_base", """
        _ROLLOUT_REGISTRY = {}

        def get_rollout_class(rollout_name, mode):
            return ROLLOUTS.lookup(rollout_name, mode)
    """)
    with pytest.raises(patches.VerlChangedError, match="no longer reads"):
        patches.apply_rollout(module)
    assert module._ROLLOUT_REGISTRY == {}  # nothing written into a table verl would ignore


# -- seam 5: verl's custom-reward wrapper ------------------------------------------------------------------------

_REWARD_WRAPPERS = """
    def _call_with_kwargs(raw_fn, extra_kwargs, *args, **kwargs):
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    async def _call_with_kwargs_async(raw_fn, extra_kwargs, *args, **kwargs):
        return await raw_fn(*args, **{**kwargs, **extra_kwargs})
"""


def test_the_reward_guard_passes_on_verls_module() -> None:
    import verl.trainer.ppo.reward as reward

    patches.check_reward_wrappers(reward)


def test_the_reward_guard_rejects_a_changed_wrapper(tmp_path: Path) -> None:
    module = _module_from_source(tmp_path, "fake_reward_signature", """
        from functools import partial

        def _call_with_kwargs(raw_fn, *args, **kwargs):
            return raw_fn(*args, **kwargs)

        async def _call_with_kwargs_async(raw_fn, extra_kwargs, *args, **kwargs):
            return await raw_fn(*args, **{**kwargs, **extra_kwargs})

        def get_custom_reward_fn(config):
            return partial(_call_with_kwargs, raw_fn, reward_kwargs)
    """)
    with pytest.raises(patches.VerlChangedError, match=r"_call_with_kwargs now takes \('raw_fn', 'args', 'kwargs'\)"):
        patches.check_reward_wrappers(module)


def test_the_reward_guard_rejects_a_loader_that_no_longer_wraps(tmp_path: Path) -> None:
    """Wrappers intact, but verl would hand over the function some other way: the start-up check could no
    longer find the user's function, so the guard trips."""
    module = _module_from_source(tmp_path, "fake_reward_loader", _REWARD_WRAPPERS + """
    def get_custom_reward_fn(config):
        return RewardFunction(raw_fn, reward_kwargs)
    """)
    with pytest.raises(patches.VerlChangedError, match="get_custom_reward_fn no longer returns"):
        patches.check_reward_wrappers(module)


# -- seam 6: the shared-prompt engine ----------------------------------------------------------------------------

def test_the_engine_guard_passes_on_verls_engine() -> None:
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import no_padding_2_padding

    patches.check_engine_seams(FSDPEngineWithLMHead, no_padding_2_padding)


def test_the_engine_guard_rejects_a_changed_signature() -> None:
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import no_padding_2_padding

    class Changed(FSDPEngineWithLMHead):
        def prepare_model_inputs(self, micro_batch, pad_mode):
            raise NotImplementedError

    with pytest.raises(patches.VerlChangedError, match="prepare_model_inputs now takes"):
        patches.check_engine_seams(Changed, no_padding_2_padding)


def test_the_engine_guard_rejects_a_step_that_no_longer_calls_the_overrides(tmp_path: Path) -> None:
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.padding import no_padding_2_padding

    module = _module_from_source(tmp_path, "fake_engine", """
        class Engine:
            def forward_step(self, micro_batch, loss_function, forward_only):
                return self.fused_forward(micro_batch, loss_function)
    """)
    changed = type("Changed", (module.Engine, FSDPEngineWithLMHead), {"__module__": module.__name__})
    with pytest.raises(patches.VerlChangedError, match=r"forward_step no longer contains \['self.prepare_model_inputs"):
        patches.check_engine_seams(changed, no_padding_2_padding)


def test_the_engine_guard_rejects_a_changed_layout(tmp_path: Path) -> None:
    """verl reading a sample's response values at other positions: the shared-prompt outputs would be read
    shifted by one token, so the guard trips."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    module = _module_from_source(tmp_path, "fake_padding", """
        def no_padding_2_padding(tensor, data):
            values = tensor.values()
            return [values[seq_offset - resp_len : seq_offset] for resp_len, seq_offset in data]
    """)
    with pytest.raises(patches.VerlChangedError, match="no_padding_2_padding no longer contains"):
        patches.check_engine_seams(FSDPEngineWithLMHead, module.no_padding_2_padding)


# -- a tripped guard on the driver names verl's version and the patch ----------------------------------------------

def _changed_wrapper(raw_fn, **kwargs):
    return raw_fn(**kwargs)


def _changed_inputs(self, micro_batch, pad_mode):
    raise NotImplementedError


@pytest.mark.parametrize(("target", "attribute", "replacement", "cpu", "named"), [
    ("verl.trainer.ppo.reward", "_call_with_kwargs", _changed_wrapper, False,
     "seam 5 (verl.trainer.ppo.reward)"),
    ("verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead", "prepare_model_inputs", _changed_inputs, True,
     "seam 6 (verl.workers.engine.fsdp.transformer_impl:FSDPEngineWithLMHead)"),
], ids=["seam 5", "seam 6"])
def test_check_all_names_verls_version_and_the_seam(monkeypatch: pytest.MonkeyPatch, target: str, attribute: str,
                                                     replacement: object, cpu: bool, named: str) -> None:
    import importlib

    module_name, _, class_name = target.partition(":")
    owner = importlib.import_module(module_name)
    monkeypatch.setattr(getattr(owner, class_name) if class_name else owner, attribute, replacement)
    with pytest.raises(patches.VerlChangedError) as tripped:
        patches.check_all(cpu=cpu)
    assert str(tripped.value).startswith(f"verl {verl.__version__} does not match AgentEvolver's {named}: ")
    assert attribute in str(tripped.value)


def test_the_engine_seam_is_checked_on_the_cpu_platform_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared-prompt engine is registered for device ``cpu`` only, so a changed engine does not stop a run
    on an accelerator."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    monkeypatch.setattr(FSDPEngineWithLMHead, "prepare_model_inputs", _changed_inputs)
    patches.check_all(cpu=False)
    with pytest.raises(patches.VerlChangedError, match="seam 6"):
        patches.check_all(cpu=True)


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
