#!/usr/bin/env bash
# bench.kube at 2,000 kwok nodes x 8 GPUs, a fifth of the pods constrained (issue 33, item 2),
# then the 500-node default run for comparison. Run on a quiet machine from the repository root:
#
#     scripts/bench-kube-2000.sh            # both runs (about 4-6 minutes on 2 quiet cores)
#     scripts/bench-kube-2000.sh 2000       # only the 2,000-node run
#     scripts/bench-kube-2000.sh 500        # only the 500-node run
#     scripts/bench-kube-2000.sh backlog    # 2,000 nodes, the pods created before the scheduler
#
# The 2,000-node run times phase 1 (16,000 one-GPU pods, 20% with a nodeSelector, node
# affinity, tolerations or hostname anti-affinity) and phase 2 (reclaim one GPU with the
# cluster full); phase 3 (half-GPU pods) would first delete 16,000 pods, which alone takes
# minutes, so it is left out here (--half 0): pods_per_second is phase 1's. The backlog run
# reports backlog_pods_per_second instead (the scheduler's own drain rate, from its start).
# Each JSON carries cpu_seconds per process for the timed phase (etcd, kube-apiserver, kwok,
# the kubelet double, the scheduler, the benchmark's client) and idle_cpu_per_second (what the
# cluster burns with no pods arriving: kwok's node leases). Each run's last line is the
# benchmark's JSON object (docs/benchmarks.md). EXTRA: more flags for every run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
which=${1:-both}
read -r -a extra <<< "${EXTRA:-}"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
big=(--nodes 2000 --gpus-per-node 8 --constrained 0.2 --whole 16000 --half 0 --timeout 600)
if [[ $which == both || $which == 2000 ]]; then
  "$PY" -m tessera.bench.kube "${big[@]}" "${extra[@]}" | tail -1
fi
if [[ $which == backlog ]]; then
  "$PY" -m tessera.bench.kube "${big[@]}" --backlog "${extra[@]}" | tail -1
fi
if [[ $which == both || $which == 500 ]]; then
  "$PY" -m tessera.bench.kube --nodes 500 --timeout 300 "${extra[@]}" | tail -1
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
