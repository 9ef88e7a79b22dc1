#!/usr/bin/env bash
# The ragtrace demo, from a fresh clone, offline, without root.  Sets up the venv from
# the lock file (a later run reuses it) and, with --phoenix, Arize Phoenix in its own
# venv; then runs examples/demo.  Options: --output DIR, --fault MODE, --rollout,
# --phoenix, --no-wait, --quick, --json (see --help: it prints at once, and builds nothing).

usage() {
  # The argparse help of examples/demo/cli.py, kept here so that --help needs no venv;
  # tests/scripts/test_help.py checks that the two agree.
  cat <<'USAGE'
usage: bash scripts/demo.sh [-h] [--output DIR]
                            [--fault {wrong_index,drop_top,shuffle}]
                            [--rollout] [--phoenix] [--no-wait] [--quick]
                            [--json]

End-to-end ragtrace demo, offline: a collector scores a live RAG app's
retrieval, the app's retrieval breaks, the drop alert fires.

options:
  -h, --help            show this help message and exit
  --output DIR          where the collector config, log, enriched spans and
                        summary go (default: demo-output/ in the repository)
  --fault {wrong_index,drop_top,shuffle}
                        how retrieval breaks in the second phase (default:
                        wrong_index)
  --rollout             instead of breaking every request, roll a new index
                        version (v2, with the fault) out to a third of the
                        traffic: the canary alert names app.index_version=v2
                        while v1's scores hold
  --phoenix             also export the enriched spans to Arize Phoenix
                        (installed into .venv-phoenix) and keep it running
                        until Ctrl-C
  --no-wait             with --phoenix: stop Phoenix and exit after printing
                        its URL
  --quick               fewer requests and shorter alert windows (tests)
  --json                print a machine-readable summary as JSON on stdout
                        (the display goes to stderr)

The first run builds .venv from uv.lock (and, with --phoenix, .venv-phoenix);
later runs reuse them.
USAGE
}
for arg in "$@"; do
  case "$arg" in -h | --help) usage; exit 0 ;; esac
done

RAGTRACE_DEMO_CALLER_CWD="$PWD"  # a relative --output is relative to where you are
export RAGTRACE_DEMO_CALLER_CWD
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"

ensure_venv
for arg in "$@"; do
  if [ "$arg" = "--phoenix" ]; then ensure_phoenix; fi
done
exec "$ROOT/.venv/bin/python" -m examples.demo "$@"
