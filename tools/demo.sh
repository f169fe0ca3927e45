#!/usr/bin/env bash
# The main job (README): install what is missing (torch, nvidia-cutlass, cmake, ninja, via pip),
# build the torch extension only (target _C: no tests, no benchmarks), then run the headline
# problem with the fused op and with eager PyTorch (python -m gemm_bn_softmax).
# Arguments go to the CLI, e.g. `bash tools/demo.sh --size 64x128x128 --iters 2 --dtype fp16`.
# Environment:
#   BUILD_DIR=build      build folder (shared with tools/test.sh)
#   JOBS=<nproc>         parallel compile jobs (each CUDA file needs ~4 GB of memory)
#   CMAKE_ARGS="..."     extra cmake arguments, e.g. "-DFUSED_CUDA=OFF"
#   PYTHON=python3       the interpreter to build for and run with
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/lib.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

need_python torch:torch cutlass_library:nvidia-cutlass==4.2.0.0
need_command cmake:"cmake>=3.24" ninja:ninja

# A new build folder is configured without tests (no googletest needed for the demo); one that
# tools/test.sh configured keeps its tests.
tests=()
[ -f "$BUILD_DIR/CMakeCache.txt" ] || tests=(-DFUSED_BUILD_TESTS=OFF)
echo "$ME: configuring $BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE="$PY" "${tests[@]}" ${CMAKE_ARGS:-}
echo "$ME: building the extension (_C) with $JOBS jobs; each CUDA file takes about a minute"
cmake --build "$BUILD_DIR" --target _C -j "$JOBS"
echo "$ME: python -m gemm_bn_softmax $*"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m gemm_bn_softmax "$@"
