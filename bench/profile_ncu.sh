#!/usr/bin/env bash
# Nsight Compute over every kernel of one op call (default: the headline shape; clocks left alone):
# speed of light, memory workload, launch stats, occupancy. Then a short summary per kernel.
#   bash bench/profile_ncu.sh [bf16|fp16|tf32|3xtf32] [sm90|generic|recompute] [MxNxK] > report.txt
# NCU_EXTRA: more ncu arguments, e.g. NCU_EXTRA="--section WarpStateStats --section SchedulerStats
# --section MemoryWorkloadAnalysis_Tables" (the shared-memory pipe's utilisation and bank conflicts).
set -uo pipefail
cd "$(dirname "$0")/.."
DTYPE=${1:-bf16}
PATH_=${2:-sm90}
SIZE=${3:-1024x8192x8192}
PY=$(command -v python3)
ncu --clock-control none --profile-from-start off \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy ${NCU_EXTRA:-} \
  "$PY" bench/profile_op.py --dtype "$DTYPE" --path "$PATH_" --size "$SIZE" 2>&1
