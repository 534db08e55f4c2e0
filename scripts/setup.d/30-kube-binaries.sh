#!/usr/bin/env bash
# Build (once) the test cluster's binaries from the Go module proxy: etcd, kube-apiserver, kubectl,
# kwok and helm, cached under ${TESSERA_CACHE:-$HOME/.cache/tessera}/bin by pinned version.
# Quick when cached. See docs/test-cluster.md.
# needed-by: test setup
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
"$PY" -m tessera.testing.binaries ensure >/dev/null   # progress on stderr
