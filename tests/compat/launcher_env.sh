#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
#
# Prints the job-identity variables each installed launcher really gives its ranks: Open MPI's
# mpirun, MPICH's mpiexec (Hydra), SLURM's srun (when a controller answers) and torchrun. Every
# launcher starts two 2-rank jobs one after the other, so what differs between jobs shows. Hydra
# puts no identity among its variables; for it the peer of PMI_FD (its per-job proxy, read with
# SO_PEERCRED, as accel does; needs python3) is printed too. Nothing is ever written to PMI_FD:
# any PMI message makes Hydra kill the job's other ranks when this one exits without a PMI
# finalize. A launcher that is missing is reported and skipped.
#
# Usage: tests/compat/launcher_env.sh            (what it printed here: fixtures/launcher_env.txt)
set -u

vars='^(MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RUN_ID|TORCHELASTIC_USE_AGENT_STORE'
vars="$vars|OMPI_MCA_ess_base_jobid|OMPI_MCA_orte_hnp_uri|OMPI_MCA_orte_precondition_transports|PMIX_NAMESPACE"
vars="$vars|PMI_FD|PMI_JOBID|PMI_KVSNAME|PMI_PORT|PMI_ID|HYDI_[A-Z_]*|HYDRA_[A-Z_]*"
vars="$vars|SLURM_JOB_ID|SLURM_STEP_ID|SLURM_STEPID|SLURM_CLUSTER_NAME)="
export ACCEL_LAUNCHER_ENV_VARS="$vars"

# What each rank runs: its variables, each line prefixed with the rank so the two ranks sort apart.
rank_script='r=${RANK:-${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-${PMI_ID:-?}}}}}
out=$(env | grep -E "$ACCEL_LAUNCHER_ENV_VARS" | LC_ALL=C sort | sed "s/^/rank $r: /")
if [ -n "${PMI_FD:-}" ] && command -v python3 >/dev/null; then
  out="$out
$(python3 -c "
import os, socket, struct
s = socket.socket(fileno=os.dup(int(os.environ[\"PMI_FD\"])))
pid = struct.unpack(\"3i\", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
print(\"rank $r: (PMI_FD peer) pid %d %s\" % (pid, open(\"/proc/%d/comm\" % pid).read().strip()))
")"
fi
printf "%s\n" "$out"  # one write, so the two ranks'"'"' lines do not interleave'

ran=0
show() {  # show <name> <version> <command...>: two jobs, rank lines sorted
  name=$1 version=$2
  shift 2
  for job in 1 2; do
    echo "== $name ($version), job $job"
    "$@" sh -c "$rank_script" 2>&1 | sed 's/^\[default[0-9]*\]://' | grep '^rank ' | LC_ALL=C sort
  done
  ran=$((ran + 1))
}

first_line() { "$@" 2>&1 | grep -v '^$' | head -n 1; }

if command -v mpirun.openmpi >/dev/null; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    show "Open MPI mpirun" "$(first_line mpirun.openmpi --version)" mpirun.openmpi --oversubscribe -np 2
else
  echo "== Open MPI mpirun: not installed (Debian: openmpi-bin), skipped"
fi

if command -v mpiexec.mpich >/dev/null; then
  show "MPICH mpiexec (Hydra)" "Hydra $(mpiexec.mpich --version 2>&1 | sed -n 's/^ *Version: *//p' | head -n 1)" mpiexec.mpich -n 2
else
  echo "== MPICH mpiexec: not installed (Debian: mpich), skipped"
fi

if ! command -v srun >/dev/null; then
  echo "== SLURM srun: not installed (Debian: slurm-client), skipped"
elif ! timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; then
  echo "== SLURM srun: installed, but no controller answers (scontrol ping), skipped"
else
  show "SLURM srun" "$(first_line srun --version)" srun -n 2 --overcommit
  show "SLURM srun --mpi=pmi2" "$(first_line srun --version)" srun --mpi=pmi2 -n 2 --overcommit
fi

if command -v torchrun >/dev/null; then
  # Debian's torch 1.13 on Python 3.11: torchrun's default --redirects/--tee values crash
  # (AttributeError: 'NoneType' object has no attribute 'get'); -r 1 -t 1 (stdout) works.
  py=$(head -n 1 "$(command -v torchrun)" | sed -n 's/^#! *//p')
  tv=$(${py:-python3} -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?')
  show "torchrun (static rendezvous)" "torch $tv" torchrun -r 1 -t 1 --nproc_per_node 2 --no_python
  show "torchrun --standalone" "torch $tv" torchrun -r 1 -t 1 --standalone --nproc_per_node 2 --no_python
else
  echo "== torchrun: not installed (Debian: python3-torch), skipped"
fi

[ "$ran" -gt 0 ] || { echo "no launcher found" >&2; exit 1; }
