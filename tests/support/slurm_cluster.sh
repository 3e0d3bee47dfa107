#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A private single-host SLURM cluster for the tests that start jobs with srun and sbatch: its own
# munged (own key and socket), slurmctld and slurmd, on ports of its own, with every file under DIR,
# so it neither needs nor disturbs a SLURM already configured on the machine. Clients reach it with
# SLURM_CONF=DIR/slurm.conf.
#
#   tests/support/slurm_cluster.sh start DIR   starts it and waits until the node takes jobs
#   tests/support/slurm_cluster.sh stop DIR    stops it and removes DIR
#
# When the cluster cannot run here (not root, a daemon not installed, it does not come up), `start`
# writes why to DIR/unavailable and still exits 0: the SLURM tests then skip and print that reason.
# ctest runs both as the setup and cleanup of the "slurm" fixture (tests/CMakeLists.txt).
set -uo pipefail
cmd=${1:-} dir=${2:-}
[[ ($cmd == start || $cmd == stop) && -n $dir ]] || { echo "usage: $0 start|stop DIR" >&2; exit 2; }

stop() {
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null
  done
  for _ in $(seq 50); do  # up to 5 s for the daemons to go before their files are removed
    alive=0
    for pidfile in "$dir"/*.pid; do [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  rm -rf "$dir"
}

if [[ $cmd == stop ]]; then stop; exit 0; fi

unavailable() {
  echo "$*" >"$dir/unavailable"
  echo "slurm_cluster: not started: $*" >&2
  exit 0
}

[[ -e $dir ]] && stop
mkdir -p "$dir" && chmod 0700 "$dir" || exit 1
dir=$(cd "$dir" && pwd)
[[ $(id -u) -eq 0 ]] || unavailable "it needs root (slurmd starts job steps as their user)"
for tool in munged mungekey slurmctld slurmd scontrol srun sbatch; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null ||
    unavailable "$tool is not installed (Debian: munge slurmctld slurmd slurm-client)"
done
export PATH=$PATH:/usr/sbin:/sbin

# Ports: the default ones (6817/6818) may belong to a real cluster on this machine.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
ctld_port=$(free_port) slurmd_port=$(free_port)
host=$(hostname -s)
cpus=$(nproc)

mungekey --create --keyfile="$dir/munge.key" --force 2>"$dir/mungekey.log" ||
  unavailable "mungekey failed: $(head -c 300 "$dir/mungekey.log")"
chmod 0400 "$dir/munge.key"
munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" 2>"$dir/munged.err" ||
  unavailable "munged did not start: $(head -c 300 "$dir/munged.err")"

mkdir -p "$dir/state" "$dir/spool"
cat >"$dir/slurm.conf" <<CONF
# Written by accel's tests/support/slurm_cluster.sh: a one-node cluster for the test suite.
ClusterName=acceltest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF=$dir/slurm.conf

slurmctld -f "$SLURM_CONF" -i 2>"$dir/slurmctld.err" ||
  unavailable "slurmctld did not start: $(tail -c 300 "$dir/slurmctld.err")"
slurmd -f "$SLURM_CONF" -N "$host" 2>"$dir/slurmd.err" ||
  unavailable "slurmd did not start: $(tail -c 300 "$dir/slurmd.err")"

# Up means: the controller answers and the node is idle (takes jobs). Up to 30 s.
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -N -o %T 2>/dev/null | head -n 1)
  [[ $state == idle* ]] && { echo "slurm_cluster: up ($host, controller port $ctld_port)"; exit 0; }
  sleep 0.2
done
unavailable "the node did not become idle within 30 s (state '${state:-none}'; logs in $dir)"
