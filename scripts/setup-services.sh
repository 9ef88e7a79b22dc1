#!/usr/bin/env bash
# Installs the real services the tests run on loopback: Redis, Prometheus,
# Alertmanager and headless Chromium from Debian, Arize Phoenix from PyPI (into .venv-phoenix, pinned
# with hashes in tools/phoenix.lock.txt).  Idempotent; a second run is fast.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
ensure_uv

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
# Headless Chromium renders Phoenix's pages in the annotation test (plus a font, for
# legible screenshots).
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-liberation)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    _log "missing Debian packages: ${need[*]} (run as root, or install them yourself)"
    exit 1
  fi
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  _log "installing Debian packages: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${need[@]}" >/dev/null
  # The packages start system daemons on the default ports; the tests run their own
  # instances on free loopback ports, so stop the system ones where we can.
  for svc in redis-server prometheus prometheus-alertmanager prometheus-node-exporter; do
    (command -v systemctl >/dev/null 2>&1 && $SUDO systemctl stop "$svc") >/dev/null 2>&1 || true
    (command -v service >/dev/null 2>&1 && $SUDO service "$svc" stop) >/dev/null 2>&1 || true
  done
fi

ensure_phoenix
