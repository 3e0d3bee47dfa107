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
    on) with=AUTO fuzz=OFF once=OFF examples=ON ;;
    off) with=OFF fuzz=ON once=ON examples=OFF ;;
    *) echo "tests/run.sh: unknown configuration '$cfg' (use on or off)" >&2; exit 2 ;;
  esac
  build="$root/build/ci-$cfg"
  echo "== accel: configuration CUDA/NCCL $cfg ($build)"
  # What does not depend on CUDA/NCCL is built and run once: the fuzz harnesses (built without
  # CUDA/NCCL in either configuration), the compat and docs-checker tests and the headers that
  # compile alike in both in the off configuration; the examples (and the docs' examples, which run
  # them) in the on one. Built with -Og, without debug info, assertions on: the tests' build is
  # most of CI's time on 2 cores (its largest test compiles in 30 s at -Og, 51 s at -O2).
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-Og -DACCEL_WITH_CUDA=$with \
    -DACCEL_WITH_NCCL=$with -DACCEL_WARNINGS_AS_ERRORS=ON -DACCEL_BUILD_FUZZERS=$fuzz \
    -DACCEL_TEST_CONFIG_INDEPENDENT=$once -DACCEL_BUILD_EXAMPLES=$examples
  cmake --build "$build" -j "$jobs"
  (cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 300)
done
