#!/usr/bin/env bash
# One call on the H200 (device tool): build against the device's torch, run every GPU test
# (ctest + pytest), check the SASS for HGMMA, run the benchmark. Logs and JSON go to $OUT.
#   run: bash tools/device_check.sh [quick|full|sanitize]   (carry: .device_cache)
# .device_cache holds what the device lacks: the nvidia-cutlass wheel and the googletest .debs
# (see tools/prepare_device_cache.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-full}
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
PY=$(command -v python3)
status=0
step() { echo; echo "=== $* ==="; }

step "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

step "setup"
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site .device_cache/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for d in .device_cache/*.deb; do dpkg -x "$d" /tmp/gtest; done

step "build"
t0=$(date +%s)
cmake -S . -B build-device -G Ninja -DPython3_EXECUTABLE="$PY" -DFUSED_CUDA=ON \
  -DGTEST_SOURCE_DIR=/tmp/gtest/usr/src/googletest -DFUSED_CUDA_PORTABLE_ARCHS=90 >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-device -j 16 2>&1 | tee "$OUT/build.log" | grep -E "error|warning: Registers|spill|FAILED" | head -40
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

step "sass"
if command -v cuobjdump >/dev/null; then
  n=$(cuobjdump --dump-sass build-device/libfused_sm90.a 2>/dev/null | grep -c HGMMA || true)
  ldl=$(cuobjdump --dump-sass build-device/libfused_sm90.a 2>/dev/null | grep -cE "\bLDL|\bSTL" || true)
  echo "HGMMA instructions in libfused_sm90.a: $n; local-memory LDL/STL: $ldl" | tee "$OUT/sass.txt"
  [ "$n" -gt 0 ] || { echo "NO HGMMA in the sm90 library"; status=1; }
fi

if [ "$MODE" = "sanitize" ]; then
  step "compute-sanitizer"
  for tool in memcheck racecheck synccheck initcheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 build-device/test_cuda_kernels --gtest_brief=1 \
      >"$OUT/sanitizer-$tool.log" 2>&1; echo "$tool test_cuda_kernels rc=$?"
    compute-sanitizer --tool $tool --error-exitcode 9 build-device/test_sm90_gemm_stats --gtest_brief=1 \
      --gtest_filter='*Odd*:*Edge*:*Small*' >"$OUT/sanitizer-sm90-$tool.log" 2>&1; echo "$tool test_sm90 rc=$?"
  done
  exit $status
fi

step "ctest"
ctest --test-dir build-device --output-on-failure -j 4 >"$OUT/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest.log" | tail -15
grep -c "Skipped" "$OUT/ctest.log" | sed 's/^/ctest skipped: /'

step "pytest"
PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" -m pytest -q -rs tests/python -p no:cacheprovider >"$OUT/pytest.log" 2>&1 || status=1
grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
grep -E "^FAILED|^ERROR|SKIPPED" "$OUT/pytest.log" | head -20

step "bench"
BENCH_ARGS=${BENCH_ARGS:---quick}
PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" bench/bench_forward.py $BENCH_ARGS --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30

echo; echo "device_check status: $status"
exit $status
