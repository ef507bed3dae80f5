#!/usr/bin/env bash
# Set up the virtualenv (scripts/setup.sh), lint, and run the default test-suite (not `slow`; `gpu` tests
# skip without a GPU). Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` or `-k config`.
#
# Without arguments (what CI runs) it also sets up the vLLM-on-CPU venv (scripts/setup_vllm_cpu.sh: created once,
# checked later) and runs the tests marked `alone`: verl's vLLM rollout training on CPU (tests/test_vllm_cpu_backend.py,
# tests/test_lora_vllm.py), which need more memory than an xdist worker's share. Where the free memory holds one on
# every worker at once (tests/memory_budget.py: 8 GiB per worker), they run INSIDE the suite, each on one worker
# beside the other's tests: a vLLM run keeps only ~1.2 of two cores busy, and the other worker fills the rest
# (docs/benchmarks.md, "The alone tests inside the suite"). Elsewhere they skip among the workers and run after the
# suite with one process. AGENTEVOLVER_TEST_ALONE=after runs them after the suite; AGENTEVOLVER_TEST_ALONE=0 leaves
# the venv and them out (so does any argument: `bash scripts/test.sh -k config`).
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
placement="$(cd tests && "$VENV/bin/python" memory_budget.py)"
if [ "${AGENTEVOLVER_TEST_ALONE:-1}" = "after" ]; then placement="after the suite (AGENTEVOLVER_TEST_ALONE=after)"; fi
echo "[test] the tests marked alone (verl's vLLM rollout on CPU) run $placement"
if [ "${placement%% *}" = "in" ]; then
  AGENTEVOLVER_TEST_ALONE_IN_SUITE=1 exec "$VENV/bin/python" -m pytest
fi
"$VENV/bin/python" -m pytest
# Only the files that mark tests `alone` are collected (collecting the whole suite again took ~14 s of the stage).
# A recording run (AGENTEVOLVER_TEST_SECONDS_OUT, tests/file_order.py) records the suite's order only: this stage
# runs apart from the xdist workers, so its files' seconds would misplace them there. A pytest process of their
# own beside the suite (three process trees on two cores) failed five of the suite's training runs once
# (docs/benchmarks.md, "The alone tests beside the suite"), so here they wait for it.
mapfile -t ALONE_FILES < <(grep -l "mark\.alone" tests/test_*.py)
echo "[test] the tests that need more memory than a worker's share: pytest -n 0 -m 'alone and not slow' ${ALONE_FILES[*]}"
AGENTEVOLVER_TEST_SECONDS_OUT="" exec "$VENV/bin/python" -m pytest -n 0 -m "alone and not slow" "${ALONE_FILES[@]}"
