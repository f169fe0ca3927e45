#!/usr/bin/env bash
# Variants of one sm90 kernel TU in one GPU session: after `bash tools/device_check.sh build`, each
# variant recompiles that TU with extra flags (e.g. -D switches the source reads with #ifndef
# defaults), swaps the object into a copy of libfused_sm90.a, links its own bench_sm90_gemm_stats
# and test_sm90_gemm_stats, then times it and runs the gtests. The variants compile in parallel.
#   VARIANTS="name:-DFLAG=1 -DOTHER=2;name2:-DFLAG=2" bash bench/cpp/variants.sh [TU[,TU...]] [bench args]
#     TU:         the source(s) under src/kernels/sm90/ (default gemm_stats_sm90_3xtf32_128x128.cu);
#                 several, comma-separated, are each recompiled with the variant's flags (e.g. the
#                 bf16 and tf32 instantiations of one kernel)
#     bench args: bench_sm90_gemm_stats's (default 1024 8192 8192 50)
#     RUNS:       timed runs per variant (default 2); BENCH_GREP: bench lines kept (default 3xtf32);
#     GTEST_FILTER: the gtests run per variant (default *3xTf32*).
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
declare -A compile
for TU in "${TUS[@]}"; do
  OBJ=CMakeFiles/fused_sm90.dir/src/kernels/sm90/$TU.o
  compile[$TU]=$(ninja -t commands "$OBJ" | tail -1)
  [ -n "${compile[$TU]}" ] || { echo "no compile command for $OBJ"; exit 2; }
done
link_bench=$(ninja -t commands bench_sm90_gemm_stats | tail -1)
link_test=$(ninja -t commands test_sm90_gemm_stats | tail -1)
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
      eval "$(echo "${compile[$TU]}" | sed "s# -o [^ ]*\.o# -o $dir/$TU.o $flags#")" >"$dir/$TU.log" 2>&1 &
    done
    failed=0
    for TU in "${TUS[@]}"; do wait -n || failed=1; done
    for TU in "${TUS[@]}"; do [ -s "$dir/$TU.o" ] || failed=1; done
    [ $failed -eq 0 ] || { echo "variant $name: compile failed"; tail -n 5 "$dir"/*.cu.log; exit 1; }
    cp libfused_sm90.a "$dir/lib.a" && (cd "$dir" && ar r lib.a "${TUS[@]/%/.o}")
    eval "$(echo "$link_bench" | sed "s#libfused_sm90.a#$dir/lib.a#g; s# -o bench_sm90_gemm_stats# -o $dir/bench#")" \
      >"$dir/link.log" 2>&1 || echo "variant $name: bench link failed"
    eval "$(echo "$link_test" | sed "s#libfused_sm90.a#$dir/lib.a#g; s# -o test_sm90_gemm_stats# -o $dir/test#")" \
      >>"$dir/link.log" 2>&1 || echo "variant $name: test link failed"
    if [ -n "$link_torch" ]; then
      rm -rf "$dir/tree" && mkdir -p "$dir/tree" && cp -r ../bench ../python "$dir/tree/"
      eval "$(echo "$link_torch" | sed "s#libfused_sm90.a#$dir/lib.a#g; s# -o _C.so# -o $dir/tree/python/gemm_bn_softmax/_C.so#")" \
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
  echo "base: $(./bench_sm90_gemm_stats $BENCH_ARGS 2>&1 | summary)"
  for name in "${built[@]}"; do echo "$name: $("/tmp/variant_$name/bench" $BENCH_ARGS 2>&1 | summary)"; done
done
for name in "${built[@]}"; do
  dir=/tmp/variant_$name
  if [ -x "$dir/test" ]; then
    echo "$name gtests: $("$dir/test" --gtest_filter="$GTEST_FILTER" 2>&1 | grep -E "^\[  (PASSED|FAILED)" | tr '\n' ' ')"
  fi
done
exit $status
