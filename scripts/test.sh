#!/usr/bin/env bash
# Set up the virtualenv (scripts/setup.sh), lint, and run the default test-suite (not `slow`; `gpu` tests
# skip without a GPU). Extra arguments go to pytest, e.g. `bash scripts/test.sh -m slow` or `-k config`.
#
# Without arguments (what CI runs) it also sets up the vLLM-on-CPU venv (scripts/setup_vllm_cpu.sh: created once,
# checked later) and runs the tests marked `alone` (verl's vLLM rollout training on CPU: tests/test_vllm_cpu_backend.py,
# tests/test_lora_vllm.py) in a pytest process of their own, one test at a time (beside other xdist workers of one
# pytest session those tests skip). That process runs BESIDE the suite when the machine's free memory holds both
# (tests/memory_budget.py: 6 GiB per xdist worker plus 8 GiB), else after it: a vLLM run keeps only ~1.2 of two
# cores busy (start-up waits, one engine step at a time), and the suite's workers fill the rest (31.3 minutes in
# all against 33.2 one after the other, docs/benchmarks.md). AGENTEVOLVER_TEST_ALONE=after runs them after the
# suite; AGENTEVOLVER_TEST_ALONE=0 leaves the venv and them out.
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
# Only the files that mark tests `alone` are collected there (collecting the whole suite again took ~14 s). A
# recording run (AGENTEVOLVER_TEST_SECONDS_OUT, tests/file_order.py) records the suite's order only: that process
# runs apart from the xdist workers, so its files' seconds would misplace them there.
mapfile -t ALONE_FILES < <(grep -l "mark\.alone" tests/test_*.py)
alone_tests() {
  AGENTEVOLVER_TEST_SECONDS_OUT="" "$VENV/bin/python" -m pytest -n 0 -p no:cacheprovider -m "alone and not slow" \
    "${ALONE_FILES[@]}"
}
placement="$(cd tests && "$VENV/bin/python" memory_budget.py)"
if [ "${AGENTEVOLVER_TEST_ALONE:-1}" = "after" ]; then placement="after the suite (AGENTEVOLVER_TEST_ALONE=after)"; fi
echo "[test] the tests that need a process of their own, $placement: pytest -n 0 -m 'alone and not slow'" \
     "${ALONE_FILES[*]}"
if [ "${placement%% *}" != "beside" ]; then
  "$VENV/bin/python" -m pytest
  alone_tests
  exit
fi
alone_log="$(mktemp -t agentevolver-alone.XXXXXX.log)"
alone_tests >"$alone_log" 2>&1 &
alone_pid=$!
# interrupted (Ctrl-C, a CI limit): that process gets Ctrl-C too, so its running test kills its run's processes
trap 'kill -INT "$alone_pid" 2>/dev/null || true; wait "$alone_pid" || true; exit 130' INT TERM
suite_status=0
"$VENV/bin/python" -m pytest || suite_status=$?
alone_status=0
wait "$alone_pid" || alone_status=$?
echo "[test] the tests that needed a process of their own (they ran beside the suite; exit status $alone_status):"
cat "$alone_log"
rm -f "$alone_log"
if [ "$suite_status" -ne 0 ]; then exit "$suite_status"; fi
exit "$alone_status"
