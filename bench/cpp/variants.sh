#!/usr/bin/env bash
# Variants of one kernel TU in one GPU session: after `bash tools/device_check.sh build`, each
# variant recompiles that TU with extra flags (e.g. -D switches the source reads with #ifndef
# defaults), swaps the object into a copy of its library (libfused_sm90.a or libfused_core.a), links
# its own bench and gtest executables (bench_sm90_gemm_stats and test_sm90_gemm_stats unless told
# otherwise), then times it and runs the gtests. The variants compile in parallel.
#   VARIANTS="name:-DFLAG=1 -DOTHER=2;name2:-DFLAG=2" bash bench/cpp/variants.sh [TU[,TU...]] [bench args]
#     TU:         the source(s) under src/kernels/sm90/ (default gemm_stats_sm90_3xtf32_128x128.cu),
#                 or under src/kernels/ when the name holds a slash (common/row_softmax.cu: a TU of
#                 libfused_core.a), or a path from the repository root when it starts with src/
#                 (src/api/forward_cuda.cu); several, comma-separated, are each recompiled with the variant's
#                 flags (e.g. the bf16 and tf32 instantiations of one kernel)
#     bench args: bench_sm90_gemm_stats's (default 1024 8192 8192 50)
#     RUNS:       timed runs per variant (default 2); BENCH_GREP: bench lines kept (default 3xtf32);
#     GTEST_FILTER: the gtests run per variant (default *3xTf32*).
#     VARIANT_BENCH, VARIANT_TEST: the bench and gtest targets linked per variant (default
#                 bench_sm90_gemm_stats, test_sm90_gemm_stats; e.g. bench_row_softmax, test_cuda_kernels).
#     VARIANT_TORCH=1: also link the torch extension against the variant's library, in a copy of
#                 bench/ and python/ at /tmp/variant_<name>/tree, so the op can be timed per build:
#                 python3 /tmp/variant_<name>/tree/bench/pipeline_breakdown.py ... (the scripts put
#                 their own tree's python/ first on the path; bench/ab_rounds.py alternates the builds).
set -uo pipefail
cd "$(dirname "$0")/../../build-device" || { echo "no build-device/: run tools/device_check.sh build first"; exit 2; }
IFS=',' read -ra TUS <<<"${1:-gemm_stats_sm90_3xtf32_128x128.cu}"
shift $(( $# > 0 ? 1 : 0 ))
BENCH_ARGS=${*:-1024 8192 8192 50}
RUNS=${RUNS:-2}
BENCH_GREP=${BENCH_GREP:-3xtf32}
GTEST_FILTER=${GTEST_FILTER:-*3xTf32*}
VARIANT_BENCH=${VARIANT_BENCH:-bench_sm90_gemm_stats}
VARIANT_TEST=${VARIANT_TEST:-test_sm90_gemm_stats}
declare -A compile lib_of
for TU in "${TUS[@]}"; do
  case "$TU" in src/*) src=$TU ;; */*) src=src/kernels/$TU ;; *) src=src/kernels/sm90/$TU ;; esac
  OBJ=$(ninja -t targets all | grep -oE "^CMakeFiles/[a-z0-9_]+\.dir/$src\.o" | head -1)
  [ -n "$OBJ" ] || { echo "no object for $src"; exit 2; }
  compile[$TU]=$(ninja -t commands "$OBJ" | tail -1)
  [ -n "${compile[$TU]}" ] || { echo "no compile command for $OBJ"; exit 2; }
  lib=${OBJ#CMakeFiles/}; lib_of[$TU]=lib${lib%%.dir/*}.a  # libfused_sm90.a or libfused_core.a
done
libs=$(printf '%s\n' "${lib_of[@]}" | sort -u)
# sed expressions that point a link command at the variant's copies of the libraries
relink() { local e="" l; for l in $libs; do e+="s#\\b$l\\b#$1/$l#g; "; done; echo "$e"; }
link_bench=$(ninja -t commands "$VARIANT_BENCH" | tail -1)
link_test=$(ninja -t commands "$VARIANT_TEST" | tail -1)
link_torch=""
if [ "${VARIANT_TORCH:-0}" = 1 ]; then
  # the link of _C.so without its POST_BUILD copy into the source tree
  link_torch=$(ninja -t commands _C | tail -1 | sed 's# && cd .*##')
  [ -n "$link_torch" ] || { echo "no link command for _C (a build without the torch extension?)"; exit 2; }
fi
names=()
IFS=';' read -ra specs <<<"${VARIANTS:-}"
for spec in "${specs[@]}"; do
  name=${spec%%:*}; flags=${spec#*:}
  [ -n "$name" ] || continue
  names+=("$name")
  dir=/tmp/variant_$name
  (
    mkdir -p "$dir"
    rm -f "$dir"/*.cu.o  # a stale object must not stand in for a failed compile
    for TU in "${TUS[@]}"; do
      obj=$dir/$(basename "$TU").o  # the archive member's name
      eval "$(echo "${compile[$TU]}" | sed "s# -o [^ ]*\.o# -o $obj $flags#")" >"$obj.log" 2>&1 &
    done
    failed=0
    for TU in "${TUS[@]}"; do wait -n || failed=1; done
    for TU in "${TUS[@]}"; do [ -s "$dir/$(basename "$TU").o" ] || failed=1; done
    [ $failed -eq 0 ] || { echo "variant $name: compile failed"; tail -n 5 "$dir"/*.o.log; exit 1; }
    for l in $libs; do cp "$l" "$dir/$l"; done
    for TU in "${TUS[@]}"; do (cd "$dir" && ar r "${lib_of[$TU]}" "$(basename "$TU").o"); done
    eval "$(echo "$link_bench" | sed "$(relink "$dir") s# -o $VARIANT_BENCH\b# -o $dir/bench#")" \
      >"$dir/link.log" 2>&1 || echo "variant $name: bench link failed"
    eval "$(echo "$link_test" | sed "$(relink "$dir") s# -o $VARIANT_TEST\b# -o $dir/test#")" \
      >>"$dir/link.log" 2>&1 || echo "variant $name: test link failed"
    if [ -n "$link_torch" ]; then
      rm -rf "$dir/tree" && mkdir -p "$dir/tree" && cp -r ../bench ../python "$dir/tree/"
      eval "$(echo "$link_torch" | sed "$(relink "$dir") s# -o _C.so# -o $dir/tree/python/gemm_bn_softmax/_C.so#")" \
        >>"$dir/link.log" 2>&1 || echo "variant $name: torch extension link failed"
    fi
  ) &
done

# The timing and the fingerprint of y's bits (equal bits: equal fingerprints). The runs alternate
# between the unchanged build and each variant (base, v1, v2, base, v1, v2, ...), after every variant
# has compiled: a drift of the GPU's clocks over the session then touches every build alike, where
# timing one build after the other would credit it to whichever ran later.
# Up to 240 characters of each line: gemm+stats, GPU only, statistics off and cuBLAS, then y's fingerprint.
summary() { grep "$BENCH_GREP" | sed -E 's/^(.{0,240}).*(y bits [0-9a-f]+).*/\1 ... \2/'; }
wait
status=0
built=()
for name in "${names[@]}"; do
  if [ -x "/tmp/variant_$name/bench" ]; then built+=("$name"); else status=1; fi
done
for i in $(seq "$RUNS"); do
  echo "base: $("./$VARIANT_BENCH" $BENCH_ARGS 2>&1 | summary)"
  for name in "${built[@]}"; do echo "$name: $("/tmp/variant_$name/bench" $BENCH_ARGS 2>&1 | summary)"; done
done
for name in "${built[@]}"; do
  dir=/tmp/variant_$name
  if [ -x "$dir/test" ]; then
    echo "$name gtests: $("$dir/test" --gtest_filter="$GTEST_FILTER" 2>&1 | grep -E "^\[  (PASSED|FAILED)" | tr '\n' ' ')"
  fi
done
exit $status
