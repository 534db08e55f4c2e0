#!/usr/bin/env bash
# The main job (README): the Run:ai fractional-GPU walkthrough, run for real in embedded mode.
# Brings the control plane up on this machine (simulated GPUs where there are none), creates
# project demo with 1 GPU, runs demo-frac05 (0.5 GPU) and demo-frac03 (0.3 GPU) side by side on
# one GPU, execs into demo-frac05 to show its share, asks for exact GPU memory (--gpu-memory 5G),
# and leaves the service running. Its names are not the README Quickstart's (team-a, frac05...),
# so the Quickstart runs as written after it (its first line stops this server).
# `./dev run trace` runs the trace benchmark instead (scripts/trace.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = trace ]; then
  shift
  exec bash scripts/trace.sh "$@"
fi
T="${TESSERA_VENV:-.venv}/bin/tessera"
PORT="${TESSERA_PORT:-8470}"
say() {
  local out="" a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=,+-]+$ ]]; then out+="$a "; else out+="'${a//\'/\'\\\'\'}' "; fi
  done
  printf '\n\033[1m$ %s\033[0m\n' "$out"
}
run() { say "$@"; "$@"; }

run $T up --detach --port "$PORT" "$@"
if ! $T project list -o json | grep -q '"name": "demo"'; then
  run $T project create demo --gpu 1
fi
run $T project set demo
# An earlier run's workloads go first (one listing, then only those that exist).
old=$($T list -o json | "${TESSERA_VENV:-.venv}/bin/python" -c 'import json, sys
print(" ".join(w["name"] for w in json.load(sys.stdin)["workloads"]
               if w["name"] in ("demo-frac05", "demo-frac03", "demo-mem5g")))')
if [ -n "$old" ]; then
  printf '(removing the previous run'"'"'s %s)\n' "$old"
  for name in $old; do $T delete "$name" >/dev/null 2>&1 || true; done
  for name in $old; do while $T describe "$name" >/dev/null 2>&1; do sleep 0.2; done; done
fi

LOOP='import os, time; print(os.environ["TESSERA_WORKLOAD_NAME"], "on", os.environ["CUDA_VISIBLE_DEVICES"], flush=True); [time.sleep(1) for _ in iter(int, 1)]'
run $T submit demo-frac05 -g 0.5 --interactive -- python3 -c "$LOOP"
run $T submit demo-frac03 -g 0.3 --interactive -- python3 -c "$LOOP"
run $T wait demo-frac05 demo-frac03 --for Running --timeout 30
run $T list
run $T exec demo-frac05 -- nvidia-smi

# Exact GPU memory: 5 GB does not fit next to 0.5 + 0.3 of a 16 GB V100, so it waits (and says why)
# until demo-frac03 is deleted.
run $T submit demo-mem5g --gpu-memory 5G -- python3 -c "$LOOP"
sleep 1
run $T list
$T describe demo-mem5g | grep -E "Status|Why pending" || true
run $T delete demo-frac03
run $T wait demo-mem5g --for Running --timeout 30
run $T list
run $T top

URL=$("${TESSERA_VENV:-.venv}/bin/python" -c "from tessera.cli.client import load_config; print(load_config()['url'])")
printf '\ntessera is running at %s (API docs: %s/docs).\n' "$URL" "$URL"
printf 'Try:\n  %s describe demo-mem5g\n  %s logs demo-frac05\n  %s down --stop-workloads   # before the README Quickstart\n' "$T" "$T" "$T"
