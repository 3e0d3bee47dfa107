#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Job start to first collective: wall time from starting a launcher until a job of N CPU ranks that
only meets in one barrier has exited, under each launcher, against torchrun running torch's own
equivalent (init_process_group on gloo + barrier) in the same run.

    /usr/bin/python3 benchmarks/compare/start_to_collective.py build/dev/bin/accel \\
        build/dev/benchmarks/first_collective_bench [--procs 2,4] [--runs 20]

Cases (each run in turn, round-robin, after one warm-up round):
  accel launch   accel launch --cpu running first_collective_bench
  mpirun         Open MPI's mpirun running first_collective_bench (when installed)
  mpiexec        MPICH's mpiexec running first_collective_bench (when installed)
  srun           SLURM's srun running first_collective_bench (when a controller answers)
  torchrun+accel torchrun running first_collective_bench (torchrun's own start-up cost)
  torchrun+torch torchrun running python: init_process_group("gloo") + barrier, the peer
Prints median and p90 per case and the ratio of torchrun+torch's median (and p90) to each case's.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TORCH_JOB = """
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("accel")
    ap.add_argument("program")
    ap.add_argument("--procs", default="2,4")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ACCEL_", "TORCHELASTIC_")) and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(ACCEL_USE_CPU="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp()
    torch_job = os.path.join(tmp, "job.py")
    with open(torch_job, "w") as f:
        f.write(TORCH_JOB)
    torchrun = shutil.which("torchrun")
    srun_ok = shutil.which("srun") and subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=env).stdout.find("is UP") >= 0

    for n in [int(p) for p in args.procs.split(",")]:
        cases = {"accel launch": [args.accel, "launch", "--cpu", "--num_processes", str(n), args.program]}
        if shutil.which("mpirun.openmpi"):
            cases["mpirun"] = ["mpirun.openmpi", "--oversubscribe", "-np", str(n), args.program]
        if shutil.which("mpiexec.mpich"):
            cases["mpiexec"] = ["mpiexec.mpich", "-n", str(n), args.program]
        if srun_ok:
            cases["srun"] = ["srun", "-n", str(n), "--overcommit", args.program]
        if torchrun:
            base = [torchrun, "-r", "1", "-t", "1", "--standalone", "--nproc_per_node", str(n)]
            cases["torchrun+accel"] = base + ["--no_python", args.program]
            cases["torchrun+torch"] = base + [torch_job]
        times = {name: [] for name in cases}
        for run in range(args.runs + 1):
            for name, argv in cases.items():
                start = time.perf_counter()
                r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                elapsed = time.perf_counter() - start
                if r.returncode != 0:
                    sys.exit("%s failed (exit %d): %s" % (name, r.returncode, r.stderr[-2000:]))
                if run > 0:  # the first round warms caches and is not counted
                    times[name].append(elapsed)
        peer = times.get("torchrun+torch")
        print("\n%d ranks, %d runs each (whole job: launcher start to exit)" % (n, args.runs))
        print("%-16s %12s %12s %22s" % ("case", "median ms", "p90 ms", "torchrun+torch / case"))
        for name, xs in times.items():
            med, p90 = statistics.median(xs) * 1e3, percentile(xs, 0.9) * 1e3
            ratio = ""
            if peer:
                ratio = "%.1fx (p90 %.1fx)" % (statistics.median(peer) * 1e3 / med, percentile(peer, 0.9) * 1e3 / p90)
            print("%-16s %12.1f %12.1f %22s" % (name, med, p90, ratio))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
