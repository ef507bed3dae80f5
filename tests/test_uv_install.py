"""scripts/uv_install.py: pip's own settings reach uv with the same meaning, or pip installs instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentevolver.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import uv_install


def _pip_env(tmp_path: Path, config: str, **variables: str) -> dict[str, str]:
    """An environment where pip reads only ``config`` (as its global file) and ``variables``."""
    (tmp_path / "pip.conf").write_text(config)
    return {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path),
            "XDG_CONFIG_DIRS": str(tmp_path), "PIP_CONFIG_FILE": str(tmp_path / "pip.conf"), **variables}


def test_pips_settings_are_read_in_pips_precedence(tmp_path: Path, monkeypatch):
    config = ("[global]\nindex-url = https://mirror.example/simple\n"
              "extra-index-url = file:///opt/a/simple file:///opt/b/simple\nfind-links = /opt/file-wheels\n"
              "constraint = /etc/machine-constraints.txt\ncert = /etc/ca.pem\ndefault-timeout = 60\n"
              "[install]\nindex-url = https://install-mirror.example/simple\n")
    env = _pip_env(tmp_path, config, PIP_FIND_LINKS="/opt/env-wheels")
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = uv_install.pip_settings(sys.executable)
    assert settings["find-links"] == "/opt/env-wheels"  # PIP_FIND_LINKS over the file's
    options, uv_env = uv_install.uv_options(settings)
    pairs = list(zip(options[::2], options[1::2], strict=False))
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip's choice among indexes: the best version
    assert ("--index-url", "https://install-mirror.example/simple") in pairs  # [install] over [global]
    assert ("--index-url", "https://mirror.example/simple") not in pairs
    assert ("--extra-index-url", "file:///opt/a/simple") in pairs and ("--extra-index-url", "file:///opt/b/simple") in pairs
    assert ("--find-links", "/opt/env-wheels") in pairs and ("--find-links", "/opt/file-wheels") not in pairs
    assert ("--constraint", "/etc/machine-constraints.txt") in pairs
    assert uv_env == {"SSL_CERT_FILE": "/etc/ca.pem"}


@pytest.mark.parametrize("setting", [{"only-binary": ":all:"}, {"pre": "true"}, {"proxy": "http://proxy:3128"}])
def test_a_setting_without_translation_hands_the_install_to_pip(setting: dict[str, str]):
    with pytest.raises(LookupError, match=next(iter(setting))):
        uv_install.uv_options(setting)


def test_the_script_exits_3_for_pip_before_installing_anything(tmp_path: Path):
    """Status 3 is what scripts/setup.sh reads as "install with pip"; uv is never started (a missing binary)."""
    env = _pip_env(tmp_path, "[global]\nonly-binary = :all:\n")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "uv_install.py"), "/nonexistent/uv",
                             sys.executable, "--", "-e", "."], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == uv_install.UNTRANSLATABLE, result.stderr
    assert "'only-binary' has no uv translation" in result.stderr


def test_setup_sh_rejects_an_unknown_installer(tmp_path: Path):
    result = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup.sh")], cwd=REPO_ROOT, capture_output=True,
                            text=True, check=False,
                            env={"PATH": "/usr/bin:/bin", "AGENTEVOLVER_INSTALLER": "conda",
                                 "AGENTEVOLVER_VENV": str(Path(sys.executable).parent.parent)})
    assert result.returncode == 2
    assert "AGENTEVOLVER_INSTALLER must be uv or pip; got 'conda'" in result.stdout
