#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Cost of creating process groups (issue 31): benchmarks/group_creation_bench.cpp under accel
# launch, first at 64 processes for every grid shape from 64 x 1 to 1 x 64, then at 8, 16, 32 and
# 64 processes for a fixed 4 stages (replicas = processes / 4). Prints the bench's CSV lines
# (median and p90 ms of the slowest rank's grid_groups call, and of a world barrier beside it).
# On a 2-core machine 64 processes are oversubscribed 32 to a core: the figures are upper bounds.
# Usage: benchmarks/group_creation.sh BUILD_DIR [--iters K]
#   (BUILD_DIR configured with -DACCEL_BUILD_BENCHMARKS=ON; build accel-cli and accel_group_creation_bench)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '3,9p' "$0" | cut -c3-; exit 0 ;; esac
build=${1:?usage: group_creation.sh BUILD_DIR [--iters K]}
shift
iters=10
while (($#)); do
  case "$1" in
    --iters) iters=$2; shift 2 ;;
    *) echo "group_creation.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
bench="$build/benchmarks/group_creation_bench"
accel="$build/bin/accel"
[[ -x "$bench" && -x "$accel" ]] || { echo "build the accel-cli and accel_group_creation_bench targets in $build first" >&2; exit 2; }

run() {  # processes shapes
  "$accel" launch --cpu --num_processes "$1" --timeout 600 "$bench" --shapes "$2" --iters "$iters"
}
echo "# 64 processes, every shape"
run 64 64x1,32x2,16x4,8x8,4x16,2x32,1x64
echo "# 4 stages, growing world"
for n in 8 16 32 64; do run "$n" "$((n / 4))x4" | if ((n == 8)); then cat; else tail -n +2; fi; done
