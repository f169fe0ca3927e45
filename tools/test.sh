#!/usr/bin/env bash
# The test command (README, .ci/run): configure + build everything (CUDA kernels included when
# nvcc is present), then ctest (C++ tests; GPU groups skip without a GPU) and pytest.
#   BUILD_DIR=build  JOBS=<n>  extra cmake args: CMAKE_ARGS="..."
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
PY=${PYTHON:-$(command -v python3 || command -v python)}

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE="$PY" ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "build: $(( $(date +%s) - start )) s"

ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q tests/python ${PYTEST_ARGS:-}
echo "total: $(( $(date +%s) - start )) s"
