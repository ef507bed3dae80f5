"""Run ``uv pip install`` with pip's own settings: the installer scripts/setup.sh prefers.

    python scripts/uv_install.py UV PYTHON -- <pip install arguments>

Why: on a fresh 2-core machine ``pip install`` of the core took 106 s and of the test extras 155 s, nearly
all of it one file after another (download, unpack, byte-compile); uv does the same work in parallel (the core
in 7 s, everything with byte-compiling in 45 s) and resolves to the same versions. But uv does not read pip's
configuration, and on many machines that configuration is what makes an install work at all (a local index, a
``find-links`` folder holding the CPU torch wheel, a machine-wide constraints file, a certificate). So this
reads pip's effective settings (``pip config list``: its files' ``[global]`` and ``[install]`` sections and its
``PIP_*`` variables, in pip's order of precedence)
and passes each as uv's option of the same meaning, with pip's way of choosing among indexes
(``--index-strategy unsafe-best-match``: the best version from any of them).

A setting that changes what gets installed and has no translation here makes this exit with status 3 before
anything is installed, and setup.sh then installs with pip, which is slower but reads its settings itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

#: pip settings (after the scope prefix) with a uv option of the same meaning.
_LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}
_ONE_OPTIONS = {"index-url": "--index-url"}
#: pip settings that do not change what gets installed, or that uv needs no option for.
_IGNORED = {
    "default-timeout", "timeout", "disable-pip-version-check", "progress-bar", "quiet", "verbose", "no-input",
    "no-color", "cache-dir", "no-cache-dir", "root-user-action", "retries", "log", "no-python-version-warning",
}
#: exit status meaning "a pip setting this cannot translate: install with pip".
UNTRANSLATABLE = 3

_LINE = re.compile(r"^(?P<scope>[^.]*)\.(?P<key>[^=]+)='(?P<value>.*)'$")


#: the sections of ``pip config list`` that apply to ``pip install``, weakest first: a file's ``[global]``, its
#: ``[install]``, then the ``PIP_*`` variables (pip has already merged the files: the later file wins there).
_SCOPE_RANK = {"global": 0, "install": 1, ":env:": 2}


def pip_settings(python: str) -> dict[str, str]:
    """pip's effective settings for ``pip install`` of ``python``'s pip: key -> value."""
    listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    ranked: dict[str, tuple[int, str]] = {}
    for line in listing.stdout.splitlines():
        match = _LINE.match(line.strip())
        if not match or match["scope"] not in _SCOPE_RANK:
            continue
        rank = _SCOPE_RANK[match["scope"]]
        if match["key"] not in ranked or rank >= ranked[match["key"]][0]:
            ranked[match["key"]] = (rank, match["value"])
    return {key: value for key, (_, value) in ranked.items() if key != "config-file"}


def uv_options(settings: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """uv options and environment variables meaning what ``settings`` mean to pip.

    Raises:
        LookupError: a setting that changes what gets installed and has no translation here.
    """
    options = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {}
    for key, value in settings.items():
        if key in _LIST_OPTIONS:
            for item in value.split():
                options += [_LIST_OPTIONS[key], item]
        elif key in _ONE_OPTIONS:
            options += [_ONE_OPTIONS[key], value]
        elif key == "no-index" and value.lower() in ("1", "true", "yes", "on"):
            options.append("--no-index")
        elif key == "cert":
            env["SSL_CERT_FILE"] = value  # uv reads the certificate bundle from this variable
        elif key not in _IGNORED:
            raise LookupError(key)
    return options, env


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    uv, python, install_args = argv[0], argv[1], argv[3:]
    try:
        options, env = uv_options(pip_settings(python))
    except LookupError as error:
        print(f"uv_install: pip setting {error.args[0]!r} has no uv translation here; installing with pip",
              file=sys.stderr)
        return UNTRANSLATABLE
    command = [uv, "pip", "install", "--python", python, "--compile-bytecode", *options, *install_args]
    print("uv_install:", " ".join(command), flush=True)
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
