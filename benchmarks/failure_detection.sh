#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Failure-detection latency: in a 3-rank CPU job, rank 1 leaves 300 ms after creating its
# DistributedState while ranks 0 and 2 wait in their first collective. Latency is measured from
# rank 1's last word ("left <ns>", printed just before it goes) to the others' reports ("failed
# <ns>", printed when their collective throws): to the first report in every run where one came,
# and to the second in runs where both came (a launcher that ends the job on the first failure may
# stop the other rank before it prints). ACCEL_TIMEOUT_S is 300 throughout, so without detection a
# run would take 300 s. Prints median and p90 (nearest rank) in ms per launcher and way of leaving.
# Usage: benchmarks/failure_detection.sh BUILD_DIR [--runs N]   (export SLURM_CONF for the srun row)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '3,10p' "$0" | cut -c3-; exit 0 ;; esac
build=${1:?usage: failure_detection.sh BUILD_DIR [--runs N]}
shift
runs=10
while (($#)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    *) echo "failure_detection.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
child="$build/tests/children/early_exit"
accel="$build/bin/accel"
[[ -x "$child" && -x "$accel" ]] || { echo "build the accel-cli and accel_child_early_exit targets in $build first" >&2; exit 2; }
export ACCEL_USE_CPU=1 ACCEL_TIMEOUT_S=300 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

launchers=("accel launch:$accel launch --cpu --num_processes 3 --timeout 300")
command -v mpirun.openmpi >/dev/null && launchers+=("mpirun (Open MPI):mpirun.openmpi --oversubscribe -np 3")
command -v mpiexec.mpich >/dev/null && launchers+=("mpiexec (MPICH):mpiexec.mpich -n 3")
# srun when a controller answers (SLURM_CONF may name a private cluster: tests/support/slurm_cluster.sh).
command -v srun >/dev/null && timeout 10 scontrol ping 2>/dev/null | grep -q "is UP" &&
  launchers+=("srun (SLURM):srun -n 3 --overcommit --immediate=60")

stats() {  # file label -> "n median p90" of the numbers in file
  sort -n "$1" | awk '{v[NR]=$1} END{if (NR==0) {printf "%2d %8s %8s", 0, "-", "-"; exit}
    m=v[int((NR+1)/2)]; i=int(NR*0.9); if (i<NR*0.9) i++; printf "%2d %8.1f %8.1f", NR, m, v[i]}'
}
printf '%-18s %-6s | %-22s | %-22s\n' "" "" "first report" "both reports"
printf '%-18s %-6s | %2s %8s %8s | %2s %8s %8s\n' launcher leaves n median p90 n median p90
for entry in "${launchers[@]}"; do
  name=${entry%%:*}
  cmd=${entry#*:}
  for how in exit0 kill; do
    : >"$tmp/first"
    : >"$tmp/both"
    for ((i = 0; i < runs; i++)); do
      timeout 120 $cmd "$child" 1 "$how" >"$tmp/out" 2>/dev/null || true
      awk '/^left /{l=$2} /^failed /{n++; if (!f || $2<f) f=$2; if ($2>g) g=$2}
           END{if (l && n>=1) printf "%.3f\n", (f-l)/1e6 > "'"$tmp/first"'.new";
               if (l && n==2) printf "%.3f\n", (g-l)/1e6 > "'"$tmp/both"'.new"}' "$tmp/out"
      for k in first both; do [[ -f "$tmp/$k.new" ]] && cat "$tmp/$k.new" >>"$tmp/$k" && rm "$tmp/$k.new"; done
    done
    printf '%-18s %-6s | %s | %s   (%d runs)\n' "$name" "$how" "$(stats "$tmp/first")" "$(stats "$tmp/both")" "$runs"
  done
done
