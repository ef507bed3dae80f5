"""The Hydra config tree: composition, validation errors that name the key, and the config CLI."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentevolver.config import PROJECT_SECTIONS, AgentEvolverSettings, compose_config, load_config
from agentevolver.errors import ConfigError
from agentevolver.paths import CONFIG_DIR, REPO_ROOT


def test_root_config_composes_verl_defaults_and_project_sections() -> None:
    cfg, settings = load_config()
    assert isinstance(settings, AgentEvolverSettings)
    # verl's ppo_trainer tree is there, with this project's overrides applied on top of it
    assert cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert cfg.algorithm.adv_estimator == "grpo"
    assert "critic" in cfg and "data" in cfg
    for section in PROJECT_SECTIONS:
        assert section in cfg
    # interpolation into verl's keys resolves
    assert settings.memory.workspace_id == cfg.trainer.experiment_name


def test_composing_finds_verls_configs_without_importing_verl() -> None:
    # The launcher and the config CLI only compose; importing verl (torch, tensordict) cost them ~5 s each.
    code = textwrap.dedent("""
        import sys
        from agentevolver.config import compose_config
        cfg = compose_config(config_name="quickstart", config_dir="examples")
        print(cfg.actor_rollout_ref.actor.clip_ratio_high, cfg.trainer.total_training_steps)
        print("verl imported:", "verl" in sys.modules, "torch imported:", "torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["0.28 4", "verl imported: False torch imported: False"]


def test_overrides_reach_the_typed_settings() -> None:
    _, settings = load_config(
        ["task_manager.n=4", "exp_manager.train_sample_mode=hybrid", "trainer.experiment_name=exp42"]
    )
    assert settings.task_manager.n == 4
    assert settings.exp_manager.train_sample_mode == "hybrid"
    assert settings.memory.workspace_id == "exp42"


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("task_manager.n=-1", "task_manager.n", "greater than or equal to 0"),
        ("task_manager.n=abc", "task_manager.n", "valid integer"),
        ("exp_manager.train_sample_mode=all", "exp_manager.train_sample_mode", "one of allkeep, alldiscard, hybrid"),
        ("exp_manager.rollout_ratio=1.5", "exp_manager.rollout_ratio", "less than or equal to 1"),
        ("exp_manager.experience_template=no-slot", "exp_manager", "'{}'"),
        ("memory.retrieve_top_k=0", "memory.retrieve_top_k", "greater than or equal to 1"),
        ("env_service.env_url=localhost:8080", "env_service.env_url", "must match pattern"),
        ("attribution_driven_credit_assignment.adca_grpo.skip_type=maybe",
         "attribution_driven_credit_assignment.adca_grpo.skip_type", "one of none, skip_small_adv, skip_all_neg"),
        ("attribution_driven_credit_assignment.adca_grpo.fix_base=0", "adca_grpo.fix_base", "greater than 0"),
        ("attribution_driven_credit_assignment.enable=maybe", "attribution_driven_credit_assignment.enable",
         "valid boolean"),
        ("llm.endpoints.local.timeout_s=-1", "llm.endpoints.local.timeout_s", "greater than 0"),
        ("llm.endpoints.local.base_url=ftp://x", "llm.endpoints.local.base_url", "http"),
        ("llm.roles.judge=nowhere", "llm.roles.judge", "nowhere"),
        ("+task_manager.nn=3", "task_manager.nn", "unknown key"),
    ],
)
def test_invalid_override_names_the_key(override: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([override])
    message = str(info.value)
    assert key in message, message
    assert fragment in message, message


def test_override_of_a_key_that_does_not_exist_says_how_to_add_it() -> None:
    with pytest.raises(ConfigError, match=r"task_manager\.nn.*prefix the override with '\+'"):
        compose_config(["task_manager.nn=3"])


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["task_manager.n=-1", "memory.updated_freq=-2"])
    message = str(info.value)
    assert "2 problems" in message
    assert "task_manager.n" in message and "memory.updated_freq" in message


def test_a_preset_in_another_folder_extends_the_root_config(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        textwrap.dedent(
            """\
            defaults:
              - agentevolver
              - _self_
            task_manager:
              n: 2
            trainer:
              experiment_name: from_preset
            """
        )
    )
    cfg, settings = load_config(config_name="mine", config_dir=tmp_path)
    assert settings.task_manager.n == 2
    assert settings.memory.workspace_id == "from_preset"
    assert cfg.actor_rollout_ref.rollout.n == 8


def test_config_without_project_sections_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "bare.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\n")
    with pytest.raises(ConfigError, match=r"defaults: \[agentevolver, _self_\]"):
        load_config(config_name="bare", config_dir=tmp_path)


def test_every_key_of_the_root_config_has_a_comment() -> None:
    """Each key in config/agentevolver.yaml is documented by the comment line(s) right above it."""
    lines = (CONFIG_DIR / "agentevolver.yaml").read_text().splitlines()
    undocumented = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w]*):\s*(\S.*)?$", line)
        if not match or match.group(2) == "defaults":
            continue
        value = (match.group(3) or "").strip()
        is_section = value == ""
        previous = lines[number - 1].strip() if number else ""
        if not is_section and not previous.startswith("#"):
            undocumented.append(f"line {number + 1}: {line.strip()}")
    assert not undocumented, "keys without a comment above them:\n" + "\n".join(undocumented)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentevolver.config", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, check=False,
    )


def test_cli_prints_a_validated_section() -> None:
    result = _run_cli("--section", "task_manager", "task_manager.n=5")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^'?n'?: 5$", result.stdout, flags=re.MULTILINE)


def test_cli_rejects_a_bad_value_without_a_traceback() -> None:
    result = _run_cli("exp_manager.train_sample_mode=all")
    assert result.returncode == 2
    assert "exp_manager.train_sample_mode: must be one of allkeep, alldiscard, hybrid; got 'all'" in result.stderr
    assert "Traceback" not in result.stderr
