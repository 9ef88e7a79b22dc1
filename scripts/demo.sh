#!/usr/bin/env bash
# The ragtrace demo, from a fresh clone, offline, without root.  Sets up the venv from
# the lock file (a later run reuses it) and, with --phoenix, Arize Phoenix in its own
# venv; then runs examples/demo.  Options: --output DIR, --fault MODE, --phoenix,
# --no-wait, --quick, --json (see --help).
RAGTRACE_DEMO_CALLER_CWD="$PWD"  # a relative --output is relative to where you are
export RAGTRACE_DEMO_CALLER_CWD
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

ensure_venv
for arg in "$@"; do
  if [ "$arg" = "--phoenix" ]; then ensure_phoenix; fi
done
exec "$ROOT/.venv/bin/python" -m examples.demo "$@"
