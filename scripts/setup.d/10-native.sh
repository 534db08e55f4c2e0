#!/usr/bin/env bash
# Builds the C isolation library from native/ (test, setup: also the fake driver and the test
# programs) with the machine's gcc and installs libtessera-cuda.so into src/tessera/isolation/lib/. Cached by content hash
# under ${TESSERA_CACHE:-$HOME/.cache/tessera}/native/, so an unchanged tree costs one hash.
# ./dev run (DEV_CMD=run) builds only the library; test and setup build everything.
# needed-by: run test setup
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PY:-.venv/bin/python}"
if [ "${DEV_CMD:-}" = run ]; then
  exec "$PY" -m tessera.isolation.build --install --lib-only
fi
exec "$PY" -m tessera.isolation.build --install
