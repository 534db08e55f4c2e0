#!/usr/bin/env bash
# valgrind (a Debian package): tests/isolation/test_bench.py counts the isolation library's
# instructions per alloc+free pair under it, the one hot-path figure machine load cannot blur.
# Installed with apt-get when missing (root, or passwordless sudo as on CI runners); otherwise one
# line says so, and that test fails naming this hook. Quick when present.
# needed-by: test setup
set -euo pipefail
command -v valgrind >/dev/null && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
  echo "[dev] valgrind missing and no root/sudo: install it (apt-get install valgrind)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[dev] valgrind missing and no apt-get: install it with your package manager" >&2
  exit 0
fi
t0=$SECONDS
echo "[dev] installing valgrind (apt-get)" >&2
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
  valgrind >/dev/null
echo "[dev] valgrind installed in $((SECONDS - t0)) s" >&2
