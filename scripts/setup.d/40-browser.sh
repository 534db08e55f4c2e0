#!/usr/bin/env bash
# The console's browser tests drive Debian's Chromium headless through chromium-driver
# (tests/console). Installed from Debian's packages when missing (apt, as root); quick when present.
# needed-by: test setup
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
echo "[dev] installing Debian's chromium and chromium-driver for the console's browser tests (about 1 min)" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || {
  $SUDO apt-get update -q >/dev/null 2>&1
  $SUDO apt-get install -y -q chromium chromium-driver >/dev/null
}
