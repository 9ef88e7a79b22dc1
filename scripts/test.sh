#!/usr/bin/env bash
# The whole test suite, from a fresh clone: venv from the lock file, the real services
# the tests need, lint, types, tests.
#
#   bash scripts/test.sh [--fast] [PYTEST ARGS...]
#   bash scripts/test.sh --help
#
# pytest runs on every core (pytest-xdist, `-n auto --dist loadgroup`; the test files
# that must share one worker are listed in tests/conftest.py) and prints the 25 slowest
# tests.  Every other argument goes to pytest, after these defaults, so it can override
# them: `-n 0` runs in one process, `tests/sdk -k export` selects, `-x` stops at the
# first failure.
#
# --fast   the quick subset: `-m "not services and not slow"`, 1.5 minutes on 2 cores.
#          It needs none of the real services, so scripts/setup-services.sh is skipped.
#          The same happens for any `-m EXPR` that says `not services`.
# --help   this text; builds and installs nothing (pytest's own options:
#          `.venv/bin/python -m pytest --help`).
#
# Markers: `services` = needs something scripts/setup-services.sh installs (Redis,
# Prometheus/promtool, Alertmanager/amtool, Arize Phoenix, Chromium); `slow` = takes more
# than about 5 s; `registry` = resolves packages on PyPI (network).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

fast=0
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    --fast) fast=1 ;;
    *) pytest_args+=("$arg") ;;
  esac
done
if [ "$fast" -eq 1 ]; then
  pytest_args=(-m "not services and not slow" "${pytest_args[@]+"${pytest_args[@]}"}")
fi
# A marker expression that leaves out the services needs none of them installed
# (pytest obeys the last -m).
markexpr=""
prev=""
for arg in "${pytest_args[@]+"${pytest_args[@]}"}"; do
  if [ "$prev" = "-m" ]; then markexpr="$arg"; elif [[ "$arg" == -m?* ]]; then markexpr="${arg#-m}"; fi
  prev="$arg"
done
need_services=1
if [[ "$markexpr" == *"not services"* ]]; then need_services=0; fi

source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_venv
if [ "$need_services" -eq 1 ]; then
  bash "$ROOT/scripts/setup-services.sh"
  export RAGTRACE_PHOENIX_PYTHON="$ROOT/.venv-phoenix/bin/python"
fi

_log "ruff"
ruff check .
ruff format --check .
_log "mypy"
mypy
_log "pytest"
python -m pytest -n auto --dist loadgroup --durations=25 "${pytest_args[@]+"${pytest_args[@]}"}"
