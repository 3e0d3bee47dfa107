#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's demo: installs what it needs, builds the accel command and the examples, then runs
# the seed program as two processes on this machine (CPU when there is no GPU), plans and loads a
# small checkpoint, and ends by running a small Llama over accel's placement (llama_generate).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build="$root/build/demo"
"$root/tools/setup-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_TESTS=OFF -DACCEL_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
echo "== accel launch --num_processes 2: each rank's device and share of the prompts"
"$build/bin/accel" launch --num_processes 2 --tee -- "$build/examples/infer_split_gather"
echo
echo "== accel plan: a small generated Llama-shaped checkpoint onto two GPUs (simulated budgets), CPU and disk"
"$root/examples/plan_demo.sh" "$build/bin/accel" "$build/demo-llama"
echo
echo "== accel load: the same plan, loaded (without a GPU: two host-simulated GPUs exactly as large as the budgets)"
"$build/bin/accel" load --checkpoint "$build/demo-llama" --max-memory '0=1536KiB,1=1536KiB,cpu=1MiB' \
  --simulate-gpus 1536KiB,1536KiB --offload-folder "$build/demo-llama/offload" --quiet
echo
echo "== llama_generate: a small Llama decoding over accel's placement (two host-simulated GPUs as large as their budgets, CPU, disk), checked against transformers"
fixture="$root/tests/compat/fixtures/forward/llama"
"$build/examples/llama_generate" --checkpoint "$fixture" --simulate-gpus 1000KiB,500KiB \
  --max-memory '0=1000KiB,1=500KiB,cpu=700KiB' --expect "$fixture/golden.json"
echo
echo "== the same budgets planned for speed: the GPUs packed fuller, only the embedding's rows cross per token"
"$build/examples/llama_generate" --checkpoint "$fixture" --simulate-gpus 1000KiB,500KiB \
  --max-memory '0=1000KiB,1=500KiB,cpu=700KiB' --objective speed --expect "$fixture/golden.json"
