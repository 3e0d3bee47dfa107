#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
# README demo: generate the small Llama-shaped checkpoint (about 4 MB, no torch needed) and plan it
# onto two pretend GPUs, CPU and disk. Explicit GPU budgets work on a machine without any GPU.
# usage: examples/plan_demo.sh [ACCEL_BINARY] [OUT_DIR]
set -eu
accel=${1:-build/dev/bin/accel}
out=${2:-build/demo-llama}
here=$(dirname "$0")
/usr/bin/python3 "$here/make_demo_checkpoint.py" "$out"
"$accel" plan --checkpoint "$out" --max-memory '0=1536KiB,1=1536KiB,cpu=1MiB' --gpu-reserve-layers 2 --svg "$out/plan.svg"
