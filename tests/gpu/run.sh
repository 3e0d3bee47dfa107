#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The prepared GPU check (one-GPU machine, under 5 minutes): build with CUDA/NCCL, run every
# [gpu]-tagged test, then the GPU benchmarks. Prints everything; exits non-zero on any failure.
# Usage: tests/gpu/run.sh [build-dir]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build/gpu}
status=0
step() { echo; echo "== $*"; }
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
nproc
step "configure + build (CUDA/NCCL ON, benchmarks ON)"
if ! dpkg-query -W nlohmann-json3-dev catch2 libbenchmark-dev >/dev/null 2>&1; then
  "$root/tools/setup-deps.sh" --bench || echo "warning: could not install dependencies"
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DACCEL_WITH_CUDA=ON -DACCEL_WITH_NCCL=ON \
  -DACCEL_BUILD_BENCHMARKS=ON >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" 2>&1 | grep -E "error|warning|Built target accel_gpu" || true
[ -x "$build/bin/accel" ] || { echo "build failed"; exit 1; }
step "accel env"
"$build/bin/accel" env || status=1
step "GPU tests"
for t in "$build"/tests/accel_gpu_*; do
  [ -x "$t" ] || continue
  echo "-- $(basename "$t")"
  timeout 120 "$t" "[gpu]" --durations yes || status=1
done
step "GPU benchmarks"
if [ -x "$build/benchmarks/load_bench" ]; then
  echo "-- load_bench (1 GiB checkpoint: CPU load vs raw read, GPU load vs pinned cudaMemcpy peak)"
  ACCEL_BENCH_GPU=1 timeout 150 "$build/benchmarks/load_bench" --size-mib 1024 --repeats 2 2>&1 | tail -40 || status=1
fi
step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
