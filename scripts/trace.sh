#!/usr/bin/env bash
# The trace benchmark (`./dev run trace`): replay the Alibaba GPU-sharing trace with the default placement policy.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${TESSERA_TRACE_DIR:-../shared/data/alibaba-gpu-v2023}"
for f in openb_node_list_gpu_node.csv openb_pod_list_default.csv; do
  if [ ! -f "$DATA/$f" ]; then
    echo "error: the trace is not here: $DATA/$f is missing. The trace is not part of this" >&2
    echo "repository: put the openb_*.csv files of Alibaba's cluster-trace-gpu-v2023" >&2
    echo "(https://github.com/alibaba/clusterdata) in a directory and set TESSERA_TRACE_DIR to it" >&2
    exit 2
  fi
done
exec .venv/bin/python -m tessera.bench.trace \
  --nodes "$DATA/openb_node_list_gpu_node.csv" \
  --pods "$DATA/openb_pod_list_default.csv" "$@"
