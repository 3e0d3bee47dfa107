#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Runs examples/llama_generate as a job of N processes under a launcher, for the examples' ctests:
accel launch, Open MPI's mpirun or MPICH's mpiexec. Prints the job's output, then
`launcher exited with status S`; the ctest checks both with regular expressions.

usage: llama_generate_launch.py [--kill-rank R --kill-after TEXT] LAUNCHER N WORK_DIR LLAMA_GENERATE [ARGS...]

LAUNCHER is `accel=PATH` (the accel command: `accel launch --cpu --num_processes N`), `openmpi` or
`mpich`. A launcher that is not installed prints `test skipped: ...` and exits 0. The job gets the
environment tests/support/launchers.hpp gives its jobs: nothing that would tell the ranks where to
meet but the launcher's own variables, Open MPI allowed to run as root, with its session files in
a folder of this job's own under WORK_DIR.

With --kill-rank R, the job's rank R (its RANK, OMPI_COMM_WORLD_RANK or PMI_RANK variable,
as accel launch, mpirun and mpiexec set it) is killed with SIGKILL half a second after a line of the job's output holds TEXT; then it prints
`killed rank R; the launcher ended T s later`, the job's output, its exit status, and
`left running: none` (or the processes of the job still alive a second after the launcher ended).
"""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

TIMEOUT_S = 120
KILL_DELAY_S = 0.5  # after the line: the job is generating, not loading
RANK_VARIABLES = (b"RANK", b"OMPI_COMM_WORLD_RANK", b"PMI_RANK")  # accel launch and torchrun, Open MPI, MPICH
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


def job_processes(program, marker):
    """{pid: environment} of every live process running `program` (a path) with JOB_MARKER=marker in its
    environment (every rank inherits the launcher's), read from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not argv or os.fsencode(program) not in argv[0]:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            if env.get(b"JOB_MARKER") != marker.encode():
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":  # a zombie waiting for its parent
                    continue
            found[int(entry)] = env
        except OSError:  # gone meanwhile
            continue
    return found


def run_and_kill(argv, env, rank, text, program):
    """Runs the job, kills its rank `rank` once its output shows `text`; returns what to print and the status."""
    marker = f"llama_generate_launch {os.getpid()} {time.time()}"
    env = dict(env, JOB_MARKER=marker)
    job = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, killed = [], {}
    def read():
        for raw in job.stdout:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            if text in line and not killed:
                time.sleep(KILL_DELAY_S)
                for pid, penv in job_processes(program, marker).items():
                    if any(penv.get(var) == str(rank).encode() for var in RANK_VARIABLES):
                        os.kill(pid, signal.SIGKILL)
                        killed["at"] = time.monotonic()
                        break
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = job.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job.kill()
        return [f"the job hung: killed after {TIMEOUT_S} s\n"], 1
    ended = time.monotonic()
    reader.join(timeout=10)
    head = [f"killed rank {rank}; the launcher ended {ended - killed['at']:.2f} s later\n" if killed
            else f"rank {rank} was never killed: no line held {text!r}\n"]
    time.sleep(1)
    left = job_processes(program, marker)
    tail = [f"launcher exited with status {status}\n",
            "left running: " + (", ".join(f"pid {pid}" for pid in left) if left else "none") + "\n"]
    return head + lines + tail, 0


def main(argv):
    kill = None
    if len(argv) > 1 and argv[1] == "--kill-rank":
        if len(argv) < 5 or argv[3] != "--kill-after":
            print(__doc__, file=sys.stderr)
            return 2
        kill = (int(argv[2]), argv[4])
        argv = argv[:1] + argv[5:]
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
    if kill:
        out, status = run_and_kill(prefix + program, environment(scratch), kill[0], kill[1], program[0])
        sys.stdout.write("".join(out))
        return status
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
