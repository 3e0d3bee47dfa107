#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The prepared GPU check (one-GPU machine, under 5 minutes): build with CUDA/NCCL, run every
# [gpu]-tagged test, then the GPU benchmarks. Prints everything; exits non-zero on any failure.
#
# Needs only what a bare GPU machine has: a compiler, CMake (ninja if present), the CUDA toolkit and
# NCCL, either installed or from Python's nvidia-nccl-cu* wheel. Catch2 and nlohmann/json come from
# .offline-deps/, made beforehand on a normal machine by tools/prepare-offline-deps.sh; nothing is
# installed here.
# Usage: tests/gpu/run.sh [build-dir]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build/gpu}
status=0
step() { echo; echo "== $*"; }
step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -5
echo "cores: $(nproc)"

step "dependencies"
args=(-DCMAKE_BUILD_TYPE=Release -DACCEL_WITH_CUDA=ON -DACCEL_WITH_NCCL=ON -DACCEL_BUILD_BENCHMARKS=ON)
if [[ -d "$root/.offline-deps" ]]; then
  echo "test dependencies from .offline-deps: $(tr '\n' ' ' <"$root/.offline-deps/VERSIONS" 2>/dev/null)"
  args+=("-DCMAKE_PREFIX_PATH=$root/.offline-deps")
fi
if [[ ! -e /usr/include/nccl.h && -z "${NCCL_ROOT:-}" ]]; then
  # The wheel keeps include/nccl.h and lib/libnccl.so.2 under site-packages/nvidia/nccl.
  for py in python3 python; do
    wheel=$("$py" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null) && break
  done
  if [[ -n "${wheel:-}" && -e "$wheel/include/nccl.h" ]]; then
    echo "NCCL from the Python wheel at $wheel"
    args+=("-DNCCL_ROOT=$wheel")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "no system NCCL and no nvidia-nccl wheel found: configure will fail with ACCEL_WITH_NCCL=ON"
  fi
fi
command -v ninja >/dev/null && args+=(-G Ninja)

step "configure + build (CUDA/NCCL ON)"
cmake -S "$root" -B "$build" "${args[@]}" >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
grep -E "accel: CUDA|google benchmark" "$build.configure.log"
targets=(accel-cli accel_example_llama_generate)
for src in "$root"/tests/gpu/*_test.cpp; do targets+=("accel_gpu_$(basename "$src" .cpp)"); done
[[ -d "$root/benchmarks" ]] && targets+=(accel_load_bench)
if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" >"$build.build.log" 2>&1; then
  grep -E "error|Error" "$build.build.log" | head -40
  echo "build failed"
  exit 1
fi
step "accel env"
"$build/bin/accel" env || status=1
step "GPU tests"
for t in "$build"/tests/accel_gpu_*; do
  [ -x "$t" ] || continue
  echo "-- $(basename "$t")"
  timeout 120 "$t" "[gpu]" --durations yes || status=1
done
step "forward pass over real device buffers (examples/llama_generate vs transformers' golden logits)"
fixture="$root/tests/compat/fixtures/forward/llama"
for budget in "0=8MiB,cpu=8MiB" "0=900KiB,cpu=500KiB"; do
  echo "-- --max-memory $budget"
  timeout 60 "$build/examples/llama_generate" --checkpoint "$fixture" --expect "$fixture/golden.json" \
    --max-memory "$budget" --offload-folder "$build/forward-offload" || status=1
done
step "GPU benchmarks"
if [ -x "$build/benchmarks/load_bench" ]; then
  echo "-- load_bench (1 GiB checkpoint: CPU load vs raw read, GPU load vs pinned cudaMemcpy peak)"
  ACCEL_BENCH_GPU=1 timeout 150 "$build/benchmarks/load_bench" --size-mib 1024 --repeats 2 2>&1 | tail -40 || status=1
fi
step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
