#!/usr/bin/env bash
# GPU validation of the memory isolation library (docs/gpu-validation.md). On a machine with an
# NVIDIA GPU (H100/H200), gcc and a Python with PyTorch:
#   scripts/gpu-validate.sh [PYTHON]        (default: python3; results in $OUT or ./gpu-validation.json)
# Builds native/ into a scratch directory with the machine's gcc, then runs scripts/gpu_validate.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-python3}"
BUILD="$(mktemp -d)/native"
make -C native BUILD="$BUILD" lib tests >/dev/null
nvidia-smi -L
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
exec "$PYTHON" scripts/gpu_validate.py --lib "$BUILD/libtessera-cuda.so" --bench "$BUILD/tests/benchalloc" \
  --json "${OUT:-.}/gpu-validation.json"
