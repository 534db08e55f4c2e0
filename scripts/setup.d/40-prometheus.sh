#!/usr/bin/env bash
# The console's usage from Prometheus (TESSERA_PROMETHEUS_URL) is tested against Debian's
# Prometheus scraping a real tessera-node (tests/console/test_usage.py). Installed from Debian's
# packages when missing (apt, as root; about 15 s); quick when present. Its service is not started.
# needed-by: test setup
set -euo pipefail
if command -v prometheus >/dev/null; then
  exit 0
fi
echo "[dev] installing Debian's prometheus for the console's usage tests (about 15 s)" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null 2>&1
  $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null
}
