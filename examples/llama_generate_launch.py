#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Runs examples/llama_generate as a job of N processes under a launcher, for the examples' ctests:
accel launch, Open MPI's mpirun or MPICH's mpiexec. Prints the job's output, then
`launcher exited with status S`; the ctest checks both with regular expressions.

usage: llama_generate_launch.py LAUNCHER N WORK_DIR LLAMA_GENERATE [ARGS...]

LAUNCHER is `accel=PATH` (the accel command: `accel launch --cpu --num_processes N`), `openmpi` or
`mpich`. A launcher that is not installed prints `test skipped: ...` and exits 0. The job gets the
environment tests/support/launchers.hpp gives its jobs: nothing that would tell the ranks where to
meet but the launcher's own variables, Open MPI allowed to run as root, with its session files in
a folder of this job's own under WORK_DIR.
"""
import os
import shutil
import subprocess
import sys

TIMEOUT_S = 120
DROPPED = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}


def environment(scratch):
    env = {k: v for k, v in os.environ.items()
           if k not in DROPPED and not k.startswith("ACCEL_") and not k.startswith("TORCHELASTIC_")}
    env.update({"ACCEL_TIMEOUT_S": "30", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_orte_tmpdir_base": scratch, "PRTE_MCA_prte_tmpdir_base": scratch})
    return env


def launcher_argv(launcher, n):
    """The launcher's argv for n ranks, or a string saying why it cannot run here."""
    if launcher.startswith("accel="):
        return [launcher[len("accel="):], "launch", "--cpu", "--num_processes", str(n)]
    if launcher == "openmpi":
        mpirun = shutil.which("mpirun.openmpi") or shutil.which("orterun")
        return [mpirun, "--oversubscribe", "-np", str(n)] if mpirun else "Open MPI's mpirun is not installed (Debian: openmpi-bin)"
    if launcher == "mpich":
        mpiexec = shutil.which("mpiexec.mpich") or shutil.which("mpiexec.hydra")
        return [mpiexec, "-n", str(n)] if mpiexec else "MPICH's mpiexec is not installed (Debian: mpich)"
    raise SystemExit(f"unknown launcher {launcher!r} (accel=PATH, openmpi, mpich)")


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    launcher, n, work, program = argv[1], int(argv[2]), argv[3], argv[4:]
    prefix = launcher_argv(launcher, n)
    if isinstance(prefix, str):
        print(f"test skipped: {prefix}")
        return 0
    scratch = os.path.join(work, "launcher")
    os.makedirs(scratch, exist_ok=True)
    try:
        done = subprocess.run(prefix + program, env=environment(scratch), stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"the job hung: killed after {TIMEOUT_S} s")
        return 1
    sys.stdout.write(done.stdout.decode("utf-8", "replace"))
    sys.stdout.write(done.stderr.decode("utf-8", "replace"))
    print(f"launcher exited with status {done.returncode}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
