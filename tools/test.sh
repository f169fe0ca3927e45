#!/usr/bin/env bash
# The test command (README, .ci/run): install what is missing, configure with the tests on, build
# everything (CUDA kernels too when nvcc is found), then run ctest (C++ tests; GPU cases skip
# without a GPU) and pytest. Finding zero tests in either is a failure. Then the examples, as a
# user runs them: the C++ library installed into a temporary prefix (cmake --install) and
# examples/cpp built against it with find_package, and examples/python with the package from python/.
# Installs when missing: torch, nvidia-cutlass, cmake, ninja, pytest, numpy (pip), and googletest
# (apt-get install libgtest-dev when run as root; otherwise it says what to install).
# Environment:
#   BUILD_DIR=build      build folder (shared with tools/demo.sh)
#   JOBS=<nproc>         parallel compile / test jobs (each CUDA file needs ~4 GB of memory)
#   CMAKE_ARGS="..."     extra cmake arguments, e.g. "-DFUSED_CUDA=ON -DGTEST_SOURCE_DIR=/src/googletest"
#   PYTEST_ARGS="..."    extra pytest arguments, e.g. "-k cli -x"
#   PYTHON=python3       the interpreter to build for and test with
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/lib.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

# googletest: what third_party/googletest.cmake finds (an installed package or Debian's sources),
# or a tree given in CMAKE_ARGS.
have_googletest() {
  case "${CMAKE_ARGS:-}" in *GTEST_SOURCE_DIR=*|*GTest_DIR=*) return 0 ;; esac
  local f
  for f in /usr/src/googletest/CMakeLists.txt /usr/src/gtest/CMakeLists.txt \
           /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h "${CONDA_PREFIX:-/nonexistent}/include/gtest/gtest.h"; do
    [ -f "$f" ] && return 0
  done
  return 1
}
# Runs a command with its output kept in a log, shown only when it fails.
quietly() {
  local log
  log=$(mktemp)
  "$@" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
  rm -f "$log"
}

if ! have_googletest; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "$ME: googletest not found; installing libgtest-dev with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev
  else
    echo "$ME: googletest not found: install it (e.g. sudo apt-get install libgtest-dev) or pass CMAKE_ARGS=-DGTEST_SOURCE_DIR=<googletest source tree>" >&2
    exit 1
  fi
fi

need_python torch:torch cutlass_library:nvidia-cutlass==4.2.0.0 pytest:pytest numpy:numpy
need_command cmake:"cmake>=3.24" ninja:ninja

start=$(date +%s)
echo "$ME: configuring $BUILD_DIR with the tests on"
cmake -S . -B "$BUILD_DIR" -G Ninja -DPython3_EXECUTABLE="$PY" ${CMAKE_ARGS:-} -DFUSED_BUILD_TESTS=ON
echo "$ME: building everything with $JOBS jobs; each CUDA file takes about a minute"
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "$ME: build took $(( $(date +%s) - start )) s"

echo "$ME: ctest"
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -j "$JOBS"
echo "$ME: examples/cpp against the installed library (cmake --install into a temporary prefix, find_package)"
example_dir=$(mktemp -d)
trap 'rm -rf "$example_dir"' EXIT
quietly cmake --install "$BUILD_DIR" --prefix "$example_dir/prefix"
quietly cmake -S examples/cpp -B "$example_dir/build" -G Ninja -DCMAKE_PREFIX_PATH="$example_dir/prefix"
quietly cmake --build "$example_dir/build"
"$example_dir/build/forward_backward_cpu"

echo "$ME: pytest"
rc=0
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q tests/python ${PYTEST_ARGS:-} || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "$ME: pytest ran no tests (none collected, or all deselected)" >&2
  exit 1
fi
[ "$rc" -eq 0 ] || exit "$rc"
echo "$ME: examples/python/train_classifier_head.py"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" examples/python/train_classifier_head.py
echo "$ME: examples/python/data_parallel_training.py"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" examples/python/data_parallel_training.py
echo "$ME: all tests passed in $(( $(date +%s) - start )) s"
