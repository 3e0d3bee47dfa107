#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up dependencies, then builds and tests accel in both configurations:
# CUDA/NCCL auto-detected (on where the toolkit is installed) and CUDA/NCCL off.
# Usage: tests/run.sh [on|off]...   (default: both)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/tools/setup-deps.sh"
configs=("$@")
((${#configs[@]})) || configs=(on off)
jobs=$(nproc 2>/dev/null || echo 2)
for cfg in "${configs[@]}"; do
  case "$cfg" in
    on) with=AUTO fuzz=OFF ;;
    off) with=OFF fuzz=ON ;;
    *) echo "tests/run.sh: unknown configuration '$cfg' (use on or off)" >&2; exit 2 ;;
  esac
  build="$root/build/ci-$cfg"
  echo "== accel: configuration CUDA/NCCL $cfg ($build)"
  # The fuzz harnesses are built without CUDA/NCCL in either configuration: the off one runs them.
  # -O2 without debug info, assertions on: the tests' build is most of CI's time on 2 cores.
  # (Not -O1: GCC 12 reports false -Warray-bounds on string concatenation there.)
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DACCEL_WITH_CUDA=$with \
    -DACCEL_WITH_NCCL=$with -DACCEL_WARNINGS_AS_ERRORS=ON -DACCEL_BUILD_FUZZERS=$fuzz
  cmake --build "$build" -j "$jobs"
  (cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 300)
done
