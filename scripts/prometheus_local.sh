#!/usr/bin/env bash
# A real Prometheus, Pushgateway and promtool for the tests: scripts/prometheus_local.sh [install|where]
#
# Unpacks Debian 12's `prometheus` (server and promtool) and `prometheus-pushgateway` packages into
# one cache folder ($LLMCTL_PROMETHEUS_DIR, default /opt/llmctl-prometheus) with `apt-get download`
# and `dpkg -x`: no services, users or files outside that folder. Binaries end up in
# $DIR/usr/bin; `where` prints that folder (the tests look there, see
# tests/integration/prom_support.py). Idempotent: a second run only checks the binaries.
# Starts nothing: each test starts its own server on 127.0.0.1 and stops it by PID.
set -euo pipefail

DIR="${LLMCTL_PROMETHEUS_DIR:-/opt/llmctl-prometheus}"
BIN="$DIR/usr/bin"
PACKAGES=(prometheus prometheus-pushgateway)
BINARIES=(prometheus promtool prometheus-pushgateway)

log() { echo "prometheus_local: $*" >&2; }
die() { log "error: $*"; exit 1; }

have_all() {
  local b
  for b in "${BINARIES[@]}"; do
    "$BIN/$b" --version >/dev/null 2>&1 || return 1
  done
}

install() {
  if have_all; then
    log "present in $BIN"
    echo "$BIN"
    return 0
  fi
  command -v apt-get >/dev/null 2>&1 || die "no apt-get: install ${PACKAGES[*]} (Debian 12) yourself and set LLMCTL_PROMETHEUS_DIR"
  mkdir -p "$DIR/debs"
  exec 9>"$DIR/.lock"
  flock -w 300 9 || die "another install holds $DIR/.lock"
  have_all && { echo "$BIN"; return 0; }
  log "downloading ${PACKAGES[*]} (apt-get download) into $DIR/debs"
  if ! (cd "$DIR/debs" && apt-get download -qq "${PACKAGES[@]}" >/dev/null 2>&1); then
    apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed"
    (cd "$DIR/debs" && apt-get download -qq "${PACKAGES[@]}" >/dev/null) \
      || die "apt-get download ${PACKAGES[*]} failed"
  fi
  local deb
  for deb in "$DIR"/debs/*.deb; do
    dpkg -x "$deb" "$DIR" || die "dpkg -x $deb failed"
  done
  have_all || die "binaries missing or not runnable in $BIN after unpacking"
  log "installed $("$BIN/prometheus" --version 2>&1 | head -1) into $BIN"
  echo "$BIN"
}

case "${1:-install}" in
  install) install ;;
  where) echo "$BIN" ;;
  *) die "usage: $0 [install|where]" ;;
esac
