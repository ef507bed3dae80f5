"""MKL's kernels on an AMD CPU: the quickstart's actor update with MKL as torch ships it and with its Intel kernels.

    .venv/bin/python bench/mkl_cpu.py [--repeats 2] [--model smollm2-135m-instruct] [--groups 4]

Why: MKL (inside torch's CPU library) runs bf16 products as fp32 on AMD CPUs, torch's CPU flash attention among
them (agentevolver/backends/cpu/mkl_cpu.py). A preload is chosen when a process starts, so each setting runs
``bench/update_profile.py --rounds 1`` in fresh processes: ``vendor`` (no preload) and ``intel`` (the
vendor-check library in ``LD_PRELOAD``), alternating inside each repeat so that a change of load hits both. The
table gives each variant's best seconds over the repeats and the ratio of ``vendor`` to ``intel`` (above 1:
the Intel kernels are faster), with the update's floor (6 x N x tokens at the measured bf16 matrix rate).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentevolver.backends.cpu.mkl_cpu import mkl_asks_vendor, shim_library  # noqa: E402
from agentevolver.backends.cpu.precision import cpu_field  # noqa: E402


def measure(env: dict[str, str], model: str, groups: int) -> dict:
    """One fresh process of bench/update_profile.py under ``env``; its JSON result."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, str(ROOT / "bench" / "update_profile.py"), "--rounds", "1", "--top", "0",
                   "--model", model, "--groups", str(groups), "--json", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            sys.exit(f"bench/update_profile.py failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups of 4 in one update (the quickstart's 4)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    if not mkl_asks_vendor():
        sys.exit("this torch does not export MKL's vendor check: nothing to compare")
    library = shim_library()
    if library is None:
        sys.exit("no C compiler (cc) to build the vendor-check library: nothing to compare")
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    settings = {"vendor": base, "intel": {**base, "LD_PRELOAD": str(library)}}
    load_at_start = os.getloadavg()[0]
    best: dict[str, dict[str, float]] = {name: {} for name in settings}
    floor = 0.0
    for index in range(args.repeats):
        for name in (list(settings) if index % 2 == 0 else list(settings)[::-1]):
            result = measure(settings[name], args.model, args.groups)
            floor = result["floor"]
            for variant, seconds in result["seconds"].items():
                best[name][variant] = min(best[name].get(variant, float("inf")), seconds)
    table = Table(title=f"actor update, MKL as shipped (vendor) vs its Intel kernels (intel): {cpu_field('model name')}, "
                        f"vendor {cpu_field('vendor_id')}; best of {args.repeats}; floor {floor:.2f} s; load "
                        f"{load_at_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    for column in ("variant", "vendor s", "intel s", "vendor / intel", "intel vs floor"):
        table.add_column(column, justify="right")
    for variant in best["vendor"]:
        vendor, intel = best["vendor"][variant], best["intel"][variant]
        table.add_row(variant, f"{vendor:.2f}", f"{intel:.2f}", f"{vendor / intel:.2f}x", f"{intel / floor:.1f}x")
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
