#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# accel launch overheads: start-up of 8 trivial processes, time from one rank failing (while the
# others sleep 30 s) to the launcher exiting, and --tee merging throughput against no launcher.
# The intended peer is torchrun; the Debian torch 1.13 here crashes in its CLI before starting any
# worker on this Python (AttributeError in elastic/multiprocessing/api.py to_map), which the last
# line shows, so it gives no figure on this machine.
# Usage: benchmarks/compare/launch_overhead.sh [path/to/accel]
set -u
case "${1:-}" in -h|--help) sed -n '3,8p' "$0" | cut -c3-; exit 0 ;; esac
accel=${1:-build/dev/bin/accel}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/failer.sh" <<'SH'
#!/bin/sh
if [ "$RANK" = 1 ]; then sleep 0.5; exit 3; fi
exec sleep 30
SH
cat >"$tmp/lines.sh" <<'SH'
#!/bin/sh
seq 1 200000 | sed 's/^/line of some length to measure merging throughput /'
SH
chmod +x "$tmp/failer.sh" "$tmp/lines.sh"
t() { local s e; s=$(date +%s.%N); "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; e=$(date +%s.%N); printf '%.2f s (exit %d)' "$(echo "$e - $s" | bc)" "$rc"; }
echo "8 x /bin/true:                    accel $(t "$accel" launch --cpu --num_processes 8 true)"
echo "rank 1 exits 3 after 0.5 s (4):   accel $(t "$accel" launch --cpu --num_processes 4 "$tmp/failer.sh")"
echo "4 x 200k lines, --tee:            accel $(t "$accel" launch --cpu --num_processes 4 --tee "$tmp/lines.sh")   ($(wc -l <"$tmp/out") lines)"
echo "4 x 200k lines, no launcher:      $(t sh -c "$tmp/lines.sh & $tmp/lines.sh & $tmp/lines.sh & $tmp/lines.sh & wait")"
echo "torchrun 8 x /bin/true:           $(t $py -m torch.distributed.run --nproc_per_node 8 --no_python true): $(tail -1 "$tmp/err")"
