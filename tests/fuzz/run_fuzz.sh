#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the store frame fuzzer with clang++ (libFuzzer + ASan + UBSan) and runs it for a while.
# Usage: tests/fuzz/run_fuzz.sh [seconds=20] [work dir=build/fuzz]
# Exit status is libFuzzer's: non-zero when it found a crash, leak or sanitizer error.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
seconds=${1:-20}
work=${2:-$root/build/fuzz}
clang=${CLANGXX:-$(command -v clang++ || command -v clang++-14 || true)}
if [[ -z "$clang" ]]; then echo "run_fuzz.sh: clang++ not found" >&2; exit 2; fi
mkdir -p "$work/corpus"
bin="$work/store_frame_fuzz"
src="$root/tests/fuzz/store_frame_fuzz.cpp"
if [[ ! -x "$bin" || "$src" -nt "$bin" || -n "$(find "$root/include" -newer "$bin" -name '*.hpp' -print -quit)" ]]; then
  "$clang" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I "$root/include" "$src" -o "$bin"
fi
# Seeds: a get and a set on an authenticated connection (first byte = harness flags).
printf '\x01\x0e\x00\x00\x00\x03\x01\x00\x00\x00k\x00\x00\x00\x00\x00\x00\x00\x00' > "$work/corpus/seed-get"
printf '\x03\x0b\x00\x00\x00\x02\x01\x00\x00\x00k\x01\x00\x00\x00v' > "$work/corpus/seed-set"
exec "$bin" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "$work/corpus"
