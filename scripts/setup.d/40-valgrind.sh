#!/usr/bin/env bash
# valgrind and strace (Debian packages): tests/isolation/test_bench.py counts the isolation
# library's instructions per alloc+free pair under valgrind, and its blocking waits with 2 threads
# under strace: the hot-path figures machine load cannot blur.
# Installed with apt-get when missing (root, or passwordless sudo as on CI runners); otherwise one
# line says so, and that test fails naming this hook. Quick when present.
# needed-by: test setup
set -euo pipefail
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v strace >/dev/null || missing+=(strace)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
  echo "[dev] ${missing[*]} missing and no root/sudo: install them (apt-get install ${missing[*]})" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "[dev] ${missing[*]} missing and no apt-get: install them with your package manager" >&2
  exit 0
fi
t0=$SECONDS
echo "[dev] installing ${missing[*]} (apt-get)" >&2
"${SUDO[@]}" apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >/dev/null
echo "[dev] ${missing[*]} installed in $((SECONDS - t0)) s" >&2
