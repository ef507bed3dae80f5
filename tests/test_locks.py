"""The two locks (constraints.txt for CPU machines, constraints-gpu.txt for GPU machines) pin every
dependency of the extras each is installed with, and agree with their hand-written pins and with the code.

Offline: only pyproject.toml and the lock files are read. A dependency added to pyproject.toml without
running ``bash scripts/lock.sh`` (or ``--gpu``) would install unpinned on a fresh machine, which is how six
packages came to install unpinned on GPU machines (issue 25).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
#: lock file -> (the hand-written pins it is resolved with, the extras it is installed with)
LOCKS = {
    "constraints.txt": ("constraints.in", ("dev", "memory", "serve", "mcp")),
    "constraints-gpu.txt": ("constraints-gpu.in", ("dev", "memory", "mcp", "gpu")),
}


def pins(path: Path) -> dict[str, list[str]]:
    """Package -> its pinned versions (a universal lock may pin two, each under its own markers)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.split(";")[0].strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {line!r} is not an exact pin"
            out.setdefault(canonicalize_name(name), []).append(version.strip())
    return out


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in extras:
        listed += project["optional-dependencies"][extra]
    return [Requirement(item) for item in listed]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_dependency_of_the_locks_extras_is_pinned_within_its_range(lock: str) -> None:
    pinned = pins(ROOT / lock)
    for requirement in requirements(LOCKS[lock][1]):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{lock} does not pin {requirement.name}; run bash scripts/lock.sh" + (
            " --gpu" if "gpu" in lock else "")
        torch_local = name == "torch"  # the CPU lock pins the local wheel's public version (2.13.0 for 2.13.0+cpu)
        assert any(requirement.specifier.contains(Version(v), prereleases=True) or torch_local
                   for v in pinned[name]), f"{lock}: {requirement} but pinned {pinned[name]}"
        for extra in requirement.extras:  # e.g. ray[default]: the extra's packages are pinned too
            assert extra == "default" or name in pinned


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_the_lock_keeps_its_hand_written_pins(lock: str) -> None:
    pinned = pins(ROOT / lock)
    for line in (ROOT / LOCKS[lock][0]).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            versions = pinned[canonicalize_name(requirement.name)]
            assert any(requirement.specifier.contains(Version(v)) for v in versions), (lock, line, versions)


def test_the_servers_xgrammar_minimum_is_the_serve_extras_and_the_gpu_lock_has_no_serve_extra() -> None:
    """The local LLM server refuses xgrammar below MIN_XGRAMMAR; vLLM 0.24 pins 0.2.3, so the GPU lock is
    resolved without the serve extra (a GPU machine serves LLM roles with vLLM) and the CPU lock fits it."""
    from agentevolver.llm_server.structured import MIN_XGRAMMAR

    minimum = Version(".".join(map(str, MIN_XGRAMMAR)))
    serve = {canonicalize_name(r.name): r for r in requirements(("serve",))}
    assert serve["xgrammar"].specifier.contains(minimum)
    assert not serve["xgrammar"].specifier.contains(Version("0.2.7")), serve["xgrammar"]
    assert all(Version(v) >= minimum for v in pins(ROOT / "constraints.txt")["xgrammar"])
    assert "serve" not in LOCKS["constraints-gpu.txt"][1]
    assert re.search(r"extras: dev, memory, mcp, gpu\)", (ROOT / "constraints-gpu.txt").read_text())
