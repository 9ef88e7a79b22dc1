# Shared setup for scripts/test.sh and scripts/demo.sh.  Source it; do not run it.
# Creates (or reuses) the project venv from uv.lock, with hashes checked (ensure_venv),
# and the pinned venvs of Arize Phoenix (ensure_phoenix) and Ragas (ensure_ragas).
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
      # The real interpreter, not a pyenv shim or a venv's symlink: uv compares this path
      # with the base interpreter of .venv, and on a mismatch rebuilds the whole venv.
      "$candidate" -c 'import os, sys; print(os.path.realpath(sys.executable))'; return 0
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
  # --compile-bytecode: the .pyc files are written once, here.  Everything else runs
  # with PYTHONDONTWRITEBYTECODE, so without them every process (each test's
  # `ragtrace-collector serve`, litellm's 6 s import) would compile its imports again.
  # A sync that changes nothing compiles nothing.
  "$UV" sync --frozen --all-packages --python "$(_python)" --quiet --compile-bytecode
  export VIRTUAL_ENV="$ROOT/.venv"
  export PATH="$ROOT/.venv/bin:$PATH"
}

_pinned_venv() {
  # _pinned_venv DIR LOCK LABEL: a venv at $ROOT/DIR holding exactly the hash-pinned
  # requirements of $ROOT/LOCK; reinstalled only when the lock file changes.  Needs no root.
  ensure_uv
  local venv="$ROOT/$1" lock="$ROOT/$2"
  local stamp="$venv/.lock-sha"
  local want
  # The stamp names the install's form too (with bytecode), so an older venv is redone.
  want="$(sha256sum "$lock" | cut -d' ' -f1) bytecode"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    _log "installing $3 into $1"
    rm -rf "$venv"
    "$UV" venv --quiet --python "$(_python)" "$venv"
    # Compiled once here: Phoenix's start-up otherwise compiles thousands of modules.
    VIRTUAL_ENV="$venv" "$UV" pip install --quiet --require-hashes --compile-bytecode -r "$lock"
    echo "$want" > "$stamp"
  fi
}

ensure_phoenix() {
  # Arize Phoenix (a tracing UI: the tests and `demo.sh --phoenix` export to it) lives in
  # its own venv, pinned with hashes in tools/phoenix.lock.txt.
  _pinned_venv .venv-phoenix tools/phoenix.lock.txt "Arize Phoenix"
  export RAGTRACE_PHOENIX_PYTHON="$ROOT/.venv-phoenix/bin/python"
}

ensure_ragas() {
  # Ragas, the baseline of benchmarks/nonllm_vs_ragas.py, in its own venv pinned with
  # hashes in tools/ragas.lock.txt, so that it never enters the project's uv.lock.
  _pinned_venv .venv-ragas tools/ragas.lock.txt "Ragas"
  export RAGTRACE_RAGAS_PYTHON="$ROOT/.venv-ragas/bin/python"
}
