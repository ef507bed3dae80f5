"""Reference AgentEvolver configs and launcher flags: refused with one message, migrated without loss.

The reference-style presets in ``fixtures/reference_configs/`` are written from the reference's documented
keys (``basic`` and ``overall`` as its examples/, ``full`` using every key that changed). Through the real
``launcher.py --dry-run``: a reference preset stops with one message naming each old key and its new name;
its migration (``python -m agentevolver.config migrate``) gives a clean plan; and every value set in the
old file is at its new key in the resolved migrated config, or listed as unmappable.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf, open_dict
from rich.console import Console

from agentevolver.config import compose_config, load_config, validate_config
from agentevolver.config.__main__ import main as config_cli
from agentevolver.config.migrate import load_yaml, migrate_tree
from agentevolver.config.reference_check import check_hydra_argv, file_problems
from agentevolver.config.reference_keys import KEY_RULES, NOTHING, REFERENCE_FLAGS
from agentevolver.config.translate import UNMAPPED, leaves, translate_key
from agentevolver.errors import ConfigError
from agentevolver.launcher.cli import main as launcher_main
from agentevolver.paths import REPO_ROOT

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "reference_configs"

_ROOT = OmegaConf.to_container(compose_config(), resolve=False)


def in_root_config(path: str) -> bool:
    """The key exists in config/agentevolver.yaml (or under a mapping there that takes any key)."""
    node: Any = _ROOT
    for part in path.split("."):
        if node is None or node == {}:
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def migrate_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = config_cli(["migrate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_nothing_lost(old_file: Path, new_file: Path, report: str) -> None:
    """Every value the old file sets is at its new key in the resolved migrated config, or is reported (and
    written at the end of the new file) as dropped or without equivalent."""
    old = load_yaml(old_file)
    migration = migrate_tree(old, in_root_config)
    cfg, _settings = load_config(config_name=new_file.stem, config_dir=new_file.parent)
    resolved_old = OmegaConf.create(old)
    by_key = {change.old: change for change in migration.changes}
    text = new_file.read_text()
    for path, _value in leaves({k: v for k, v in old.items() if k not in ("defaults", "hydra")}):
        change = by_key.get(path)
        if change is None:  # kept where it was, with its (resolved) value
            expected = OmegaConf.select(resolved_old, path)
            assert OmegaConf.select(cfg, path) == expected, path
        elif change.kind in UNMAPPED:
            assert path in report and f"#   {path}: " in text, path
        else:
            for new_key, new_value in change.new.items():
                assert OmegaConf.select(cfg, new_key) == new_value, (path, new_key)


# -- reference presets through launcher.py ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["basic", "overall"])
def test_reference_preset_fails_with_one_message_and_its_migration_runs(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old_file = FIXTURES / f"{name}.yaml"
    before = run([str(REPO_ROOT / "launcher.py"), "--conf", str(old_file), "--dry-run"], tmp_path)
    assert before.returncode == 2, before.stderr
    assert "Traceback" not in before.stderr and before.stderr.count("launcher: error:") == 1
    assert "appears more than once" in before.stderr  # the cause of Hydra's error is named, not Hydra's error
    assert "defaults: ppo_trainer: remove it" in before.stderr
    for key in ("base_url", "workspace_id", "enable_summarizer", "enable_context_generator", "retrieve_top_k",
                "updated_freq"):
        assert f"exp_manager.reme.{key}: now memory.{key}" in before.stderr
    assert f"python -m agentevolver.config migrate {old_file}" in before.stderr
    assert not (tmp_path / "launcher_record").exists()

    new_file = tmp_path / f"{name}_migrated.yaml"
    code, _out, report = migrate_cli([str(old_file), "-o", str(new_file)], capsys)
    assert code == 0, report
    assert "check: the migrated config composes and validates" in report

    after = run([str(REPO_ROOT / "launcher.py"), "--conf", str(new_file), "--dry-run"], tmp_path)
    assert after.returncode == 0, after.stderr
    assert f"launch plan for experiment 'ref_{name}'" in after.stdout and "agentevolver.main_ppo" in after.stdout
    assert "error" not in after.stderr and "warning" not in after.stderr
    assert_nothing_lost(old_file, new_file, report)


def test_full_reference_config_migrates_without_losing_a_setting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new_file = tmp_path / "full_migrated.yaml"
    code, _out, report = migrate_cli([str(FIXTURES / "full.yaml"), "-o", str(new_file)], capsys)
    assert code == 0, report
    assert_nothing_lost(FIXTURES / "full.yaml", new_file, report)
    cfg, settings = load_config(config_name=new_file.stem, config_dir=tmp_path)
    assert settings.agent_flow.context_template == "self_clip" and settings.agent_flow.max_steps == 12
    assert settings.memory.workspace_id == "full_ws" and settings.exp_manager.off_cliprange_high == 0.5
    assert settings.env_service.val_split == "test"
    grader = settings.task_manager.grader
    assert (grader.synthetic_grader, grader.scoring, grader.use_reference_answer) == ("llm", "binary", True)
    assert settings.attribution_driven_credit_assignment.adca_grpo.allocation_inconsistent_weight == 0.3
    assert settings.task_manager.num_explore_threads == 6  # ${thread_pool.max_workers}: its value written in
    assert cfg.agent_flow.context.chat_template_kwargs.enable_thinking is False


def test_migrate_report_lists_every_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, report = migrate_cli([str(FIXTURES / "full.yaml")], capsys)  # YAML to stdout, report to stderr
    assert code == 0, report
    assert out.startswith("# Migrated from") and "memory:\n  base_url: http://127.0.0.1:8013" in out
    lines = report.splitlines()
    expected = {
        "moved": "exp_manager.reme.base_url: now memory.base_url",
        "renamed": 'task_manager.grader.synthetic_grader="llm-binary-gt-no_constraint": now '
                   "task_manager.grader.synthetic_grader=llm",
        "rewrote": 'task_manager.num_explore_threads: "${thread_pool.max_workers}" -> 6',
        "dropped": "attribution_driven_credit_assignment.evaluation_type=api: ",
        "NO EQUIVALENT": "attribution_driven_credit_assignment.model=\"some-judge-model\": llm.roles.judge",
        "added": "defaults: agentevolver",
    }
    for label, fragment in expected.items():
        assert any(line.strip().startswith(label) and fragment in line for line in lines), (label, report)
    assert "neg_unconsistent_scale=-0.3" in report  # same weight as pos_unconsistent_scale: dropped, not lost
    assert "summary: 17 moved or rewritten, 15 dropped (nothing lost), 12 with no equivalent" in report


def test_migrate_reports_what_still_does_not_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("defaults: [ppo_trainer, agentevolver, _self_]\nexp_manager:\n  rollout_ratoi: 0.5\n"
                   "  reme:\n    retrieve_top_k: 0\n")
    code, _out, report = migrate_cli([str(old), "-o", str(tmp_path / "new.yaml")], capsys)
    assert code == 1
    assert "unknown" in report and "exp_manager.rollout_ratoi=0.5: kept" in report
    assert "does not validate yet" in report and "memory.retrieve_top_k" in report


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["missing.yaml"], "missing.yaml: no such file"),
        (["{basic}", "-o", "{tmp}/agentevolver.yaml"], "root config's name"),
        (["{basic}", "-o", "{tmp}/exists.yaml"], "pass --force"),
        (["{basic}", "-o", "{basic}"], "that is the input file"),
        (["{basic}", "-o", "{tmp}/out.json"], "expected a .yaml file name"),
    ],
)
def test_migrate_refuses_bad_paths(args: list[str], fragment: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "exists.yaml").write_text("a: 1\n")
    argv = [arg.format(basic=FIXTURES / "basic.yaml", tmp=tmp_path) for arg in args]
    code, out, err = migrate_cli(argv, capsys)
    assert code == 2 and fragment in err and not out
    assert (tmp_path / "exists.yaml").read_text() == "a: 1\n"


# -- the table ----------------------------------------------------------------------------------------------

def test_table_matches_this_projects_config() -> None:
    """Old keys are not ours (or the rule is about values only); every new key exists here."""
    for rule in KEY_RULES:
        assert not in_root_config(rule.old) or rule.new == rule.old, rule.old
        targets = [rule.new] if rule.new is not None else []
        for value in rule.values.values():
            targets += list(value) if isinstance(value, dict) else ([] if value is NOTHING else [rule.new])
        assert all(target is not None and in_root_config(target) for target in targets), rule.old
        assert rule.new is not None or rule.note, rule.old


@pytest.mark.parametrize("path", [REPO_ROOT / "config" / "agentevolver.yaml",
                                  *sorted((REPO_ROOT / "examples").glob("*.yaml"))], ids=lambda p: p.name)
def test_this_projects_configs_are_not_reference_configs(path: Path) -> None:
    assert file_problems(path) == []


def test_translate_values() -> None:
    assert translate_key("actor_rollout_ref.rollout.use_qwen3", False, {}).kind == "dropped"
    assert translate_key("task_manager.grader.synthetic_grader", "env", {}) is None
    assert translate_key("actor_rollout_ref.rollout.context_template", "linear", {}).new == {
        "agent_flow.context_template": "linear"}
    tree = {"attribution_driven_credit_assignment": {"pos_unconsistent_scale": 0.3}}
    neg = "attribution_driven_credit_assignment.neg_unconsistent_scale"
    assert translate_key(neg, -0.3, tree).kind == "dropped"
    assert translate_key(neg, -0.5, tree).kind == "no_equivalent"
    assert translate_key("attribution_driven_credit_assignment.consistent_scale", 1, {}).kind == "dropped"
    assert translate_key("attribution_driven_credit_assignment.adca_grpo.do_batch_norm", 1, {}).kind == \
        "no_equivalent"  # 1 is not true: YAML's bool and int are kept apart


# -- overrides and entry points -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("+exp_manager.reme.base_url=http://127.0.0.1:9", "write `memory.base_url=http://127.0.0.1:9`"),
        ("+exp_manager.reme={enable_summarizer: true}", "is now `memory.enable_summarizer=true`"),
        ("actor_rollout_ref.rollout.multi_turn.max_steps=3", "write `agent_flow.max_steps=3`"),
        ("+actor_rollout_ref.rollout.multi_turn.max_steps=3", "write `agent_flow.max_steps=3`"),
        ("+actor_rollout_ref.actor.off_cliprange_high=0.5", "write `exp_manager.off_cliprange_high=0.5`"),
        ("+data.val_type=test_normal", "is now `env_service.val_split=test`"),
        ("+thread_pool.max_workers=2", "no equivalent here; pools are sized where they are used"),
        ("+attribution_driven_credit_assignment.evaluation_type=api", "remove it"),
        ("task_manager.grader.synthetic_grader=llm-binary-gt", "task_manager.grader.use_reference_answer=true"),
        ("~exp_manager.reme", "not a key here (now memory)"),
    ],
)
def test_old_key_overrides_are_refused_with_the_new_name(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert f"{override}: " in str(info.value) and fragment in str(info.value)


def test_config_cli_refuses_an_old_override_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert config_cli(["+exp_manager.reme.workspace_id=w"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: reference AgentEvolver config keys (1 to change)")
    assert "write `memory.workspace_id=w`" in err


def test_main_ppo_refuses_a_reference_preset_before_hydra(tmp_path: Path) -> None:
    done = run(["-m", "agentevolver.main_ppo", "--config-path", str(FIXTURES), "--config-name", "overall.yaml",
                "+exp_manager.reme.updated_freq=3"], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "exp_manager.reme.enable_summarizer: now memory.enable_summarizer" in done.stderr
    assert "write `memory.updated_freq=3`" in done.stderr and "defaults: ppo_trainer" in done.stderr


def test_hydra_command_line_finds_the_config_file(tmp_path: Path) -> None:
    check_hydra_argv(["--config-name", "quickstart", "trainer.total_training_steps=1"])
    check_hydra_argv(["-cp", str(tmp_path), "-cn", "missing"])  # Hydra reports a missing file itself
    for argv in (["--config-path", str(FIXTURES), "--config-name", "basic"],
                 [f"--config-path={FIXTURES}", "--config-name=basic.yaml"],
                 ["-cd", str(FIXTURES), "-cn", "basic"]):
        with pytest.raises(ConfigError, match=r"exp_manager\.reme\.base_url: now memory\.base_url"):
            check_hydra_argv(argv)


def test_a_preset_that_includes_a_reference_preset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ref.yaml").write_text((FIXTURES / "basic.yaml").read_text())
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ref\n  - _self_\n")
    with pytest.raises(ConfigError, match=r"ref\.yaml: exp_manager\.reme\.retrieve_top_k: now memory"):
        load_config(config_name="mine", config_dir=tmp_path)


def test_validate_config_refuses_reference_keys_in_a_composed_config() -> None:
    cfg = compose_config(config_name="quickstart")
    with open_dict(cfg):
        cfg.exp_manager.reme = {"retrieve_top_k": 2}
        cfg.actor_rollout_ref.rollout.sparse = False
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert "exp_manager.reme.retrieve_top_k: now memory.retrieve_top_k" in str(info.value)
    assert "actor_rollout_ref.rollout.sparse: now agent_flow.sparse_reward" in str(info.value)


# -- reference launcher flags -------------------------------------------------------------------------------

def launch(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    messages = io.StringIO()
    code = launcher_main(["--conf", str(REPO_ROOT / "examples" / "quickstart.yaml"), *args],
                         console=Console(file=messages, width=300, soft_wrap=True))
    return code, capsys.readouterr().out, messages.getvalue()


@pytest.mark.parametrize(
    ("flags", "env", "served", "service"),
    [
        (["--with-appworld"], "appworld", "--env appworld", "env"),
        (["--with-bfcl"], "bfcl", "--env bfcl", "env"),
        (["--with-appworld", "--with-bfcl"], "bfcl", "--env appworld,bfcl", "env"),
        (["--with-env", "calc", "--with-bfcl"], "calc", "--env calc,bfcl", "env"),
        (["--with-reme"], "calc", "agentevolver.memory_service", "memory"),
    ],
)
def test_reference_service_flags_run_with_a_warning(flags: list[str], env: str, served: str, service: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    code, plan, messages = launch([*flags, "--dry-run", "--", f"env_service.env_type={env}"], capsys)
    assert code == 0, messages
    assert served in plan and f"service {service}" in plan
    ours = "--with-memory" if service == "memory" else "--with-env"
    for flag in flags:
        if flag.startswith("--with-") and flag != "--with-env":
            assert f"warning: {flag} is the reference launcher's flag: read as {ours}" in messages


@pytest.mark.parametrize(("flags", "fragment"), [
    (["--with-webshop"], "no webshop environment"),
    (["--with-crafters"], "no crafters environment"),
    (["-k"], "never kills other jobs by name"),
    (["--kill"], "never kills other jobs by name"),
    (["--python-killer"], "never kills other jobs by name"),
    (["--db", "tag"], "RAY_DEBUG_POST_MORTEM=1"),
    (["--reboot"], "did nothing"),
])
def test_reference_flags_without_a_counterpart_are_refused(flags: list[str], fragment: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, plan, messages = launch([*flags, "--dry-run"], capsys)
    assert code == 2 and not plan
    assert "error: reference AgentEvolver launcher flags (1 to change" in messages
    assert f"{flags[0]}: not an option here; " in messages and fragment in messages


def test_refused_flags_and_reference_keys_come_in_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    messages = io.StringIO()
    code = launcher_main(["--conf", str(FIXTURES / "basic.yaml"), "--with-appworld", "--reboot", "--kill",
                          "--dry-run", "--", "+task_manager.strategy_args.max_explore_step=4"],
                         console=Console(file=messages, width=300, soft_wrap=True))
    text = messages.getvalue()
    assert code == 2 and text.count("launcher: error:") == 1
    assert "--reboot: not an option" in text and "--kill: not an option" in text
    assert "exp_manager.reme.base_url: now memory.base_url" in text
    assert "write `task_manager.max_explore_step=4`" in text


def test_every_reference_flag_is_handled() -> None:
    """Each reference launcher flag is an alias of ours or refused with a note; none is 'unrecognized'."""
    spellings = [flag for rule in REFERENCE_FLAGS for flag in rule.flags]
    assert len(spellings) == len(set(spellings))
    for rule in REFERENCE_FLAGS:
        assert rule.note and (rule.replacement is None) == (rule.env is None and rule.service is None)


def test_docs_list_every_reference_key_and_flag() -> None:
    configuration = (REPO_ROOT / "docs" / "configuration.md").read_text()
    section = configuration[configuration.index("## Migrating a reference config"):]
    assert not [rule.old for rule in KEY_RULES if rule.old.rsplit(".", 1)[-1] not in section]
    launcher_doc = (REPO_ROOT / "docs" / "launcher.md").read_text()
    assert not [flag for rule in REFERENCE_FLAGS for flag in rule.flags if f"`{flag}" not in launcher_doc]
