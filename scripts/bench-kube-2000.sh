#!/usr/bin/env bash
# bench.kube at 2,000 kwok nodes x 8 GPUs, a fifth of the pods constrained (issue 33, item 2),
# then the 500-node default run for comparison. Run on a quiet machine from the repository root:
#
#     scripts/bench-kube-2000.sh            # both runs (about 6-8 minutes on 2 quiet cores)
#     scripts/bench-kube-2000.sh 2000       # only the 2,000-node run
#
# The 2,000-node run times phase 1 (16,000 one-GPU pods, 20% with a nodeSelector, node
# affinity, tolerations or hostname anti-affinity) and phase 2 (reclaim one GPU with the
# cluster full); phase 3 (half-GPU pods) would first delete 16,000 pods, which alone takes
# minutes, so it is left out here (--half 0): pods_per_second is phase 1's. Each run's last
# line is the benchmark's JSON object (docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
which=${1:-both}
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [[ $which == both || $which == 2000 ]]; then
  "$PY" -m tessera.bench.kube --nodes 2000 --gpus-per-node 8 --constrained 0.2 \
    --whole 16000 --half 0 --timeout 180 | tail -1
fi
if [[ $which == both || $which == 500 ]]; then
  "$PY" -m tessera.bench.kube --nodes 500 --timeout 120 | tail -1
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
