#!/usr/bin/env bash
# The whole test suite, from a fresh clone: venv from the lock file, the real services
# the tests need, lint, types, tests.  Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv
bash "$ROOT/scripts/setup-services.sh"
export RAGTRACE_PHOENIX_PYTHON="$ROOT/.venv-phoenix/bin/python"

_log "ruff"
ruff check .
ruff format --check .
_log "mypy"
mypy
_log "pytest"
python -m pytest "$@"
