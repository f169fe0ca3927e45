#!/usr/bin/env bash
# The check on a GPU machine (the H200 used for development): build in build-device/ against that
# machine's torch, run every GPU test (ctest + pytest), check the SASS for HGMMA, run the benchmark.
# Logs and JSON go to $OUT (default /tmp/device_out).
#   bash tools/device_check.sh [full|sanitize|bench]
#     full:     build, SASS check, ctest, pytest, then bench_forward.py with $BENCH_ARGS
#               (BENCH_ARGS=none skips it); NCU=1 adds Nsight Compute over each kernel.
#     sanitize: compute-sanitizer (memcheck/racecheck/synccheck/initcheck) over every kernel, each
#               run cut at $SANITIZER_TIMEOUT s (default 90; racecheck over all of test_cuda_kernels
#               needed more on 2026-12-04).
#     bench:    build, then bench_forward.py with $BENCH_ARGS (default: everything, with a
#               time budget of 7 minutes; continue with --resume <json>).
#     build:    setup, build and the SASS check only.
#     distributed: (a machine with 2+ GPUs) build, the data-parallel gtests, test_distributed.py
#               (NCCL included) and the pytest files in $PYTEST_FILES, then bench_distributed.py with
#               $BENCH_ARGS (BENCH_ARGS=none skips it).
# CMAKE_ARGS: extra configure arguments, e.g. -DFUSED_BUILD_GEMM_SWEEP=ON.
# GIT_REV: the commit the benchmark JSON records (its "git" field). Give it in the command, e.g.
# GIT_REV=d940439: the GPU machine's copy of the repository may hold an older .git than the tree it
# builds, so `git rev-parse` there can name the wrong commit (without GIT_REV the JSON then records
# that commit with "+changes" appended: tracked files differ from it).
# Nothing is downloaded: the nvidia-cutlass wheel and the googletest .debs come from .device_cache/
# (filled by tools/prepare_device_cache.sh on a machine with internet access).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${GIT_REV:-}" ] && ! [[ "$GIT_REV" =~ ^[0-9a-f]{7,40}$ ]]; then
  echo "GIT_REV='$GIT_REV' is not a commit hash: the JSON would record it as one" >&2
  exit 2
fi
MODE=${1:-full}
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
PY=$(command -v python3)
status=0
step() { echo; echo "=== $* ==="; }
# pytest, one process per file (a crash in one file does not hide the others' results), appended to
# $OUT/pytest.log; a summary line per file, the failures' lines when one fails.
run_pytest_files() {
  local f rc
  for f in "$@"; do
    PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" -X faulthandler -m pytest -q -rfs --tb=short -p no:cacheprovider "$f" \
      >"$OUT/pytest-one.log" 2>&1
    rc=$?
    cat "$OUT/pytest-one.log" >>"$OUT/pytest.log"
    echo "$f rc=$rc: $(grep -E 'passed|failed|error' "$OUT/pytest-one.log" | tail -1)"
    [ $rc -eq 0 ] || { status=1; grep -E "^E  |^FAILED|Fatal Python|line [0-9]+ in " "$OUT/pytest-one.log" | head -16; }
  done
  rm -f "$OUT/pytest-one.log"
}

step "device"
# Kept to 8 files in $OUT: env.log build.log ctest.log pytest.log bench.log bench.json extra.log ncu.tgz
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$OUT/env.log"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

step "setup"
"$PY" -m pip install -q --no-index --no-deps --target /tmp/site .device_cache/nvidia_cutlass-*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
for d in .device_cache/*.deb; do dpkg -x "$d" /tmp/gtest; done

step "build"
t0=$(date +%s)
cmake -S . -B build-device -G Ninja -DPython3_EXECUTABLE="$PY" -DFUSED_CUDA=ON \
  -DGTEST_SOURCE_DIR=/tmp/gtest/usr/src/googletest -DFUSED_CUDA_PORTABLE_ARCHS=90 ${CMAKE_ARGS:-} >>"$OUT/env.log" 2>&1 \
  || { tail -30 "$OUT/env.log"; exit 1; }
cmake --build build-device -j 16 2>&1 | tee "$OUT/build.log" | grep -E "error|warning: Registers|spill|FAILED" | head -40
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "BUILD FAILED"; tail -40 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

step "sass"
if command -v cuobjdump >/dev/null; then
  n=$(cuobjdump --dump-sass build-device/libfused_sm90.a 2>/dev/null | grep -c HGMMA || true)
  ldl=$(cuobjdump --dump-sass build-device/libfused_sm90.a 2>/dev/null | grep -cE "\bLDL|\bSTL" || true)
  echo "HGMMA instructions in libfused_sm90.a: $n; local-memory LDL/STL: $ldl" | tee -a "$OUT/env.log"
  [ "$n" -gt 0 ] || { echo "NO HGMMA in the sm90 library"; status=1; }
fi

if [ "$MODE" = "build" ]; then  # the build alone, for a command that runs its own steps next
  echo "device_check status: $status"
  exit $status
fi

if [ "$MODE" = "sanitize" ]; then
  # compute-sanitizer over every kernel on small, odd shapes; then the pytest files in $PYTEST_FILES.
  step "compute-sanitizer"
  SM90_SMALL='Sm90GemmStats.OddM:Sm90GemmStats.NNotMultipleOfTile:Sm90GemmStats.NoBias:Sm90GemmStats.EvalModeNoStatistics:Sm90GemmStats.SplitK'
  # the one-kernel forward: ragged tf32 in eval, one row in the last row tile, two tiles per SM
  # (racecheck reports hazards there, the loader warp's reads of the tile after a CTA barrier, under every
  # barrier form tried, with every test passing: bench/NOTES.md, twenty-first session)
  ONE_KERNEL='*sm90_tf32_M1000_N508_K520*:*M129_N2816*:*M300_N1800*'
  # the 3xTF32 kernels: the forward's (inf and NaN, two tiles per CTA) and the backward's (dx shapes, and
  # inf and NaN with a as stored and transposed)
  SM90_3XTF32='Sm90Gemm3xTf32.SpecialValuesAsInFp32'
  ROW_MAJOR_3XTF32='*InfAndNan*:*DxShapes*'
  : >"$OUT/ctest.log"
  for tool in memcheck racecheck synccheck initcheck; do
    for t in "test_cuda_kernels:*" "test_sm90_gemm_stats:$SM90_SMALL:$SM90_3XTF32" "test_forward_gpu:$ONE_KERNEL" \
             "test_sm90_3xtf32_row_major:$ROW_MAJOR_3XTF32"; do
      bin=${t%%:*}; filter=${t#*:}
      timeout "${SANITIZER_TIMEOUT:-90}" compute-sanitizer --tool $tool --error-exitcode 9 "build-device/$bin" --gtest_brief=1 \
        --gtest_filter="$filter" >"$OUT/sanitizer-one.log" 2>&1
      rc=$?
      cat "$OUT/sanitizer-one.log" >>"$OUT/ctest.log"
      echo "$tool $bin rc=$rc: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/sanitizer-one.log" | tr '\n' ' ' | cut -c1-150)"
      [ $rc -eq 0 ] || status=1
    done
  done
  rm -f "$OUT/sanitizer-one.log"
  run_pytest_files ${PYTEST_FILES:-}
  echo "device_check status: $status"
  exit $status
fi

if [ "$MODE" = "distributed" ]; then
  step "interconnect"
  nvidia-smi topo -m 2>&1 | tee -a "$OUT/env.log" | head -8
  nvidia-smi nvlink -s 2>&1 >>"$OUT/env.log"
  step "data-parallel gtests"
  for t in "test_forward_gpu:*" "test_backward_gpu:BackwardGpuDataParallel.*"; do
    bin=${t%%:*}; filter=${t#*:}
    "build-device/$bin" --gtest_brief=1 --gtest_filter="$filter" >>"$OUT/ctest.log" 2>&1 || status=1
    echo "$bin ($filter): $(grep -E "PASSED|FAILED" "$OUT/ctest.log" | tail -1)"
  done
  step "pytest (distributed, then \$PYTEST_FILES)"
  run_pytest_files tests/python/test_distributed.py ${PYTEST_FILES:-}
  if [ "${BENCH_ARGS:-}" != "none" ]; then
    step "bench (distributed)"
    PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" bench/bench_distributed.py ${BENCH_ARGS:-} --out "$OUT/bench.json" \
      >"$OUT/bench.log" 2>&1 || status=1
    tail -20 "$OUT/bench.log"
  fi
  echo "device_check status: $status"
  exit $status
fi

if [ "$MODE" = "bench" ]; then
  step "bench"
  BENCH_ARGS=${BENCH_ARGS:---profile --time-budget 420}
  PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" bench/bench_forward.py $BENCH_ARGS --no-plots --json "$OUT/bench.json" \
    >"$OUT/bench.log" 2>&1 || status=1
  grep -vE "^bench:|it/s\]|s/it\]" "$OUT/bench.log" | tail -60
  echo "device_check status: $status"
  exit $status
fi

step "ctest"
ctest --test-dir build-device --output-on-failure -j 4 >"$OUT/ctest.log" 2>&1 || status=1
grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/ctest.log" | tail -15
grep -c "Skipped" "$OUT/ctest.log" | sed 's/^/ctest skipped: /'

step "error-path smoke test"
PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" -X faulthandler tools/repro_error_path.py >"$OUT/extra.log" 2>&1
rc=$?; tail -4 "$OUT/extra.log"
if [ $rc -ne 0 ] && command -v cuda-gdb >/dev/null; then
  PYTHONPATH="$PWD/python:$PYTHONPATH" timeout 120 cuda-gdb -batch -ex run -ex bt --args "$PY" tools/repro_error_path.py \
    >>"$OUT/extra.log" 2>&1
  grep -E "^#[0-9]+" "$OUT/extra.log" | head -25
fi

step "pytest"
: >"$OUT/pytest.log"
run_pytest_files ${PYTEST_FILES:-tests/python/test_*.py}

BENCH_ARGS=${BENCH_ARGS:---quick --no-compile --cases headline eval --profile}
if [ "$BENCH_ARGS" != "none" ]; then
  step "bench"
  PYTHONPATH="$PWD/python:$PYTHONPATH" "$PY" bench/bench_forward.py $BENCH_ARGS --no-plots --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | tail -30
fi

if [ "${NCU:-0}" = "1" ] && command -v ncu >/dev/null; then
  # one report + markdown summary per (dtype, path): every kernel either path launches
  mkdir -p /tmp/ncu
  for cfg in ${NCU_CASES:-bf16:sm90 tf32:sm90 bf16:generic}; do
    dt=${cfg%%:*}; pth=${cfg#*:}
    step "ncu ($dt $pth, one op call)"
    PYTHONPATH="$PWD/python:$PYTHONPATH" bash bench/profile_ncu.sh "$dt" "$pth" >"/tmp/ncu/ncu-$dt-$pth.txt" 2>&1
    "$PY" bench/ncu_summary.py "/tmp/ncu/ncu-$dt-$pth.txt" --dtype "$dt" | tee "/tmp/ncu/ncu-$dt-$pth.md"
  done
  tar -czf "$OUT/ncu.tgz" -C /tmp/ncu .
fi

echo; echo "device_check status: $status"
exit $status
