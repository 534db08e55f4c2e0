#!/usr/bin/env bash
# The trace benchmark (`./dev run trace`): replay the Alibaba GPU-sharing trace with the default placement policy.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${TESSERA_TRACE_DIR:-../shared/data/alibaba-gpu-v2023}"
exec .venv/bin/python -m tessera.bench.trace \
  --nodes "$DATA/openb_node_list_gpu_node.csv" \
  --pods "$DATA/openb_pod_list_default.csv" "$@"
