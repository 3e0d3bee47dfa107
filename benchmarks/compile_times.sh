#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compile time of one-line consumers of <accel/state.hpp> and <accel/accel.hpp> (g++ -c -O2,
# C++20), with CUDA/NCCL on (toolkit headers) and off, for this tree and optionally for another
# checkout of accel (e.g. an earlier commit in a git worktree), runs interleaved so both see the
# same machine load. Prints median and p90 seconds per case, and whether nlohmann/json is reached.
# Usage: benchmarks/compile_times.sh [--runs N] [--other DIR]
set -euo pipefail
runs=9
other=""
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --other) other=$(cd "$2" && pwd); shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "compile_times.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cxx=${CXX:-g++}
cuda_inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include <accel/state.hpp>\nint main() { return 0; }\n' >"$tmp/state.cpp"
printf '#include <accel/accel.hpp>\nint main() { return 0; }\n' >"$tmp/accel.cpp"
trees=("this:$here")
[[ -n "$other" ]] && trees+=("other:$other")
configs=("on:-DACCEL_WITH_CUDA=1 -DACCEL_WITH_NCCL=1 -I$cuda_inc" "off:-DACCEL_WITH_CUDA=0 -DACCEL_WITH_NCCL=0")
compile() {  # tree config header -> seconds
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$cxx" -std=c++20 -O2 -I"$2/include" $3 -c "$tmp/$4.cpp" -o "$tmp/out.o"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
"$cxx" -std=c++20 -O2 -c "$tmp/state.cpp" -I"$here/include" -o "$tmp/out.o"  # warm the page cache
declare -A samples
for ((i = 0; i < runs; ++i)); do
  for tree in "${trees[@]}"; do
    for cfg in "${configs[@]}"; do
      for h in state accel; do
        key="${tree%%:*} ${cfg%%:*} $h"
        samples[$key]+="$(compile x "${tree#*:}" "${cfg#*:}" "$h") "
      done
    done
  done
done
printf '%-6s %-5s %-10s %8s %8s  %s\n' tree cuda header median_s p90_s "nlohmann/json reached"
for tree in "${trees[@]}"; do
  for cfg in "${configs[@]}"; do
    for h in state accel; do
      key="${tree%%:*} ${cfg%%:*} $h"
      read -r med p90 < <(tr ' ' '\n' <<<"${samples[$key]}" | grep . | sort -g |
        awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; p=a[int(NR*0.9+0.999)]; print m, p}')
      # shellcheck disable=SC2086
      json=$("$cxx" -std=c++20 -I"${tree#*:}/include" ${cfg#*:} -H -fsyntax-only "$tmp/$h.cpp" 2>&1 | grep -c 'nlohmann/json.hpp' || true)
      printf '%-6s %-5s %-10s %8.2f %8.2f  %s\n' "${tree%%:*}" "${cfg%%:*}" "$h.hpp" "$med" "$p90" "$([[ $json -gt 0 ]] && echo yes || echo no)"
    done
  done
done
