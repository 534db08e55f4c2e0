#!/usr/bin/env bash
# The real-node tier (tests/realnode, docs/real-node.md): Debian's runc and CNI plugins (apt, as
# root), and kubelet v1.36.3 + containerd v2.4.2 built once from the Go module proxy, cached under
# ${TESSERA_CACHE:-$HOME/.cache/tessera}/bin (about 17 min cold on 2 cores; quick when cached).
# needed-by: test setup
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
missing=()
command -v runc >/dev/null || missing+=(runc)
[ -e /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif sudo -n true 2>/dev/null; then SUDO=(sudo -n); else
    echo "[dev] the real-node tier needs ${missing[*]} (apt-get install -y ${missing[*]}) and root;" \
         "its tests (pytest -k real_node) will fail until then" >&2
    SUDO=(false)
  fi
  if [ "${SUDO[0]:-}" != false ]; then
    echo "[dev] installing ${missing[*]} for the real-node tier (apt-get)" >&2
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null || {
      "${SUDO[@]}" apt-get update -qq >/dev/null
      DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
    } || { echo "[dev] apt-get install ${missing[*]} failed: the real-node tier will fail" >&2; exit 1; }
  fi
fi
"$PY" -c "from tessera.testing import realnode; realnode.ensure_binaries()" >/dev/null
