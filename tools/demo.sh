#!/usr/bin/env bash
# The main job: set up what is needed, build, and run the headline problem with the fused op and
# with eager PyTorch (python -m gemm_bn_softmax). Arguments go to the CLI, e.g. --dtype fp16.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
"$PY" -c "import torch, cutlass_library, ninja, cmake" 2>/dev/null ||
  "$PY" -m pip install -q torch nvidia-cutlass==4.2.0.0 "cmake>=3.24" ninja
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE="$PY" -DFUSED_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m gemm_bn_softmax "$@"
