#!/usr/bin/env bash
# Usage: bash examples/ablation/measure_exemplars.sh [OUT_DIR]   (ports 8080 and 8001 must be free; ~13 min)
# Issue 24 part 1 through the product: exemplars as turns on calc's hard levels (SmolLM2-135M, greedy).
# 1. a memory of solved training episodes: main_ppo exp_mode=init_only (no training), 48 training tasks x 2;
# 2. 32 validation tasks, greedy, without experience and with the most similar exemplar as turns.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
R="${1:-/tmp/measure_exemplars}"; rm -rf "$R"; mkdir -p "$R"
PY=.venv/bin/python
$PY -m env_service --env calc --host 127.0.0.1 --port 8080 > $R/env.log 2>&1 & ENV=$!
$PY -m agentevolver.memory_service --host 127.0.0.1 --port 8001 --data-dir $R/memory > $R/memory.log 2>&1 & MEM=$!
trap 'kill $ENV $MEM 2>/dev/null || true' EXIT
for u in 8080 8001; do for i in $(seq 60); do curl -sf http://127.0.0.1:$u/healthz >/dev/null && break; sleep 2; done; done
date; echo "== build the memory (init_only)"
/usr/bin/time -f "%e s" $PY -m agentevolver.main_ppo --config-name quickstart_hard exp_mode=init_only \
  exp_manager.experience_kind=exemplar exp_manager.init_exp_max_tasks=48 actor_rollout_ref.rollout.n=2 \
  memory.workspace_id=exm trainer.val_before_train=false trainer.default_local_dir=$R/init \
  trainer.experiment_name=exm hydra.run.dir=$R/hydra > $R/init.log 2>&1
curl -s -X POST http://127.0.0.1:8001/vector_store -H 'content-type: application/json' \
  -d '{"workspace_id": "exm", "action": "list"}' | $PY -c "import json,sys; print('exemplars stored:', len(json.load(sys.stdin)['metadata']['action_result']))"
for arm in without with; do
  date; echo "== validation tasks, experience: $arm"
  mode=woexp; [ $arm = with ] && mode=all
  $PY -m agentevolver.rollout --config-name quickstart_hard --split val/chain+word+distractor+convert \
    --num-tasks 32 --n 1 --greedy --run-dir $R/$arm exp_mode=exist_train exp_manager.val_rollout_mode=$mode \
    exp_manager.experience_kind=exemplar memory.retrieve_top_k=1 memory.workspace_id=exm 2>&1 | tail -25
done
date
