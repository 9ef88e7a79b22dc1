# Shared setup for scripts/test.sh and scripts/demo.sh.  Source it; do not run it.
# Creates (or reuses) the project venv from uv.lock, with hashes checked.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export ROOT
cd "$ROOT"

# No component of ours may reach for the network on its own.
export LITELLM_LOCAL_MODEL_COST_MAP=True
export UV_PYTHON_DOWNLOADS=never
export PYTHONDONTWRITEBYTECODE=1

_log() { printf '\033[1m[ragtrace]\033[0m %s\n' "$*" >&2; }

_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"; return 0
    fi
  done
  _log "Python >= 3.11 is required and was not found on PATH"; return 1
}

ensure_uv() {
  # uv itself comes pinned, with hashes, into its own small venv.
  UV="$ROOT/.tools/bin/uv"
  if [ ! -x "$UV" ]; then
    _log "bootstrapping uv into .tools/"
    "$(_python)" -m venv "$ROOT/.tools"
    "$ROOT/.tools/bin/pip" install --quiet --disable-pip-version-check \
      --require-hashes -r "$ROOT/tools/uv.lock.txt"
  fi
  export UV
}

ensure_venv() {
  ensure_uv
  _log "syncing .venv from uv.lock"
  "$UV" sync --frozen --all-packages --python "$(_python)" --quiet
  export VIRTUAL_ENV="$ROOT/.venv"
  export PATH="$ROOT/.venv/bin:$PATH"
}
