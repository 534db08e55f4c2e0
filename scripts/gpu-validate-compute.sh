#!/usr/bin/env bash
# Compute share on a real NVIDIA GPU (docs/compute-share.md; design §6). NOT RUN YET: no GPU was
# lent to the session that wrote it (docs/gpu-validation.md). Never changes the GPU's settings.
#
#   scripts/gpu-validate-compute.sh [PYTHON]     # PYTHON: with PyTorch for the graph/latency checks
#
# Builds native/ (libtessera-cuda.so) and a CUDA spin program (clock64 busy-wait of D us, grid =
# SMs x k, unsynchronised launches, at most M in flight), then runs scripts/gpu_validate_compute.py:
# one PASS/FAIL line per check, JSON to $OUT/gpu-validate-compute.json (or ./).
set -euo pipefail
PY=${1:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/tessera-gpu-compute.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
command -v nvidia-smi >/dev/null || { echo "FAIL: no nvidia-smi (no GPU here)"; exit 2; }
command -v nvcc >/dev/null || { echo "FAIL: no nvcc (the spin kernel needs it)"; exit 2; }
nvidia-smi -L
make -s -C "$ROOT/native" BUILD="$WORK/build" lib
cat > "$WORK/gpuspin.cu" <<'CU'
// gpuspin: kernels that busy-wait D microseconds, launched without synchronising (at most M in
// flight, waited for through events); prints completions every 100 ms and a final JSON line.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <cuda_runtime.h>
__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    double us = 1000, seconds = 5; int inflight = 32, onoff = 0, graph = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--us")) us = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--inflight")) inflight = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--onoff")) onoff = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--graph")) graph = 1;
    }
    cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
    long long cycles = (long long)(us * p.clockRate / 1000.0);
    int grid = p.multiProcessorCount * 2;
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraphExec_t exec = nullptr;
    if (graph) {
        cudaGraph_t g; cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        for (int k = 0; k < 4; k++) spin<<<grid, 32, 0, s>>>(cycles / 4);
        cudaStreamEndCapture(s, &g); cudaGraphInstantiate(&exec, g, 0);
    }
    std::vector<cudaEvent_t> ev(inflight);
    for (auto &e : ev) cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    int head = 0, tail = 0, out = 0; long long done = 0;
    double t0 = now(), next = t0 + 0.1;
    printf("start %.6f\n", t0); fflush(stdout);
    while (true) {
        double t = now();
        if (t >= next) { printf("%.3f %lld\n", t - t0, done); fflush(stdout); next += 0.1; }
        if (t - t0 >= seconds) break;
        if (onoff && ((long long)((t - t0) * 1000) / onoff) % 2 == 1) {
            while (out) { cudaEventSynchronize(ev[tail]); tail = (tail + 1) % inflight; out--; done++; }
            struct timespec ts = {0, 1000000}; nanosleep(&ts, nullptr); continue;
        }
        if (out == inflight) { cudaEventSynchronize(ev[tail]); tail = (tail + 1) % inflight; out--; done++; }
        cudaError_t rc = graph ? cudaGraphLaunch(exec, s) : (spin<<<grid, 32, 0, s>>>(cycles), cudaGetLastError());
        if (rc != cudaSuccess) { fprintf(stderr, "gpuspin: launch: %s\n", cudaGetErrorString(rc)); return 3; }
        cudaEventRecord(ev[head], s); head = (head + 1) % inflight; out++;
    }
    while (out) { cudaEventSynchronize(ev[tail]); tail = (tail + 1) % inflight; out--; done++; }
    printf("{\"completed\": %lld, \"elapsed\": %.3f}\n", done, now() - t0);
    return 0;
}
CU
nvcc -O2 -o "$WORK/gpuspin" "$WORK/gpuspin.cu"
OUT_DIR=${OUT:-.}
PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$ROOT/scripts/gpu_validate_compute.py" \
  --library "$WORK/build/libtessera-cuda.so" --spin "$WORK/gpuspin" --work "$WORK" --out "$OUT_DIR/gpu-validate-compute.json"
