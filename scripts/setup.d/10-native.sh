#!/usr/bin/env bash
# Builds native/ (GPU memory isolation library, fake driver, test programs) with the machine's
# gcc and installs libtessera-cuda.so into src/tessera/isolation/lib/. Cached by content hash
# under ${TESSERA_CACHE:-$HOME/.cache/tessera}/native/, so an unchanged tree costs one hash.
# needed-by: run test setup
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
exec "$PY" -m tessera.isolation.build --install
