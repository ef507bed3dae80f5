#!/usr/bin/env bash
# CPU quickstart: set up the virtualenv (scripts/setup.sh), then the main job: the launcher starts the `calc`
# environment service, trains SmolLM2-135M-Instruct on it with GRPO (examples/quickstart.yaml), records the
# run under launcher_record/quickstart/ and stops the service again. Arguments are passed on to the launcher,
# e.g. `bash scripts/quickstart.sh --with-logview` or `bash scripts/quickstart.sh -- trainer.total_training_steps=2`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The quickstart needs the core alone (no test tools, memory service, structured outputs, MCP or agent frameworks):
# on a fresh machine that skips about a third of the downloads (triton alone is 286 MB). A venv that has the extras
# already is left as it is.
AGENTEVOLVER_EXTRAS="${AGENTEVOLVER_EXTRAS-}" bash scripts/setup.sh
VENV="${AGENTEVOLVER_VENV:-$ROOT/.venv}"
exec "$VENV/bin/python" launcher.py --conf examples/quickstart.yaml --with-env "$@"
