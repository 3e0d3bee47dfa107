#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""accel's point-to-point beside torch gloo's, alternating in one run.

    python3 benchmarks/compare/p2p_vs_gloo.py BUILD_DIR [--rounds 3] [--max BYTES] [--python VENV_PYTHON]

Each round runs `accel launch --cpu --num_processes 2 BUILD_DIR/benchmarks/p2p_bench` and then
benchmarks/compare/p2p_gloo.py (torch.distributed on gloo, two processes), both after their own
warm-up, with the same cases: an 8-byte ping-pong round trip and one message of 1 KiB ... --max
bytes answered with 8 bytes. Prints, per case, the median over rounds of each side's median and
p90 (microseconds), the ratio gloo / accel of the medians (above 1: accel faster), and accel's
time against one memcpy of the same size (memcpy / message: 1.0 means a message costs one copy).
BUILD_DIR is a Release build with -DACCEL_BUILD_BENCHMARKS=ON (targets accel-cli, accel_p2p_bench).
"""
import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_csv(argv):
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        parts = line.split(",")
        if len(parts) != 9 or parts[0] == "impl":
            continue
        impl, case, nbytes, _iters, med, p90, _mbs, memcpy_us, _vs = parts
        rows[(case, int(nbytes))] = (float(med), float(p90), float(memcpy_us))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max", type=int, default=256 << 20)
    ap.add_argument("--python", default=sys.executable, help="a Python with torch (default: this one)")
    args = ap.parse_args()
    accel = [os.path.join(args.build, "bin", "accel"), "launch", "--cpu", "--num_processes", "2",
             os.path.join(args.build, "benchmarks", "p2p_bench"), "--max", str(args.max)]
    gloo = [args.python, os.path.join(HERE, "p2p_gloo.py"), "--max", str(args.max)]
    seen = {"accel": [], "gloo": []}
    for r in range(args.rounds):
        for name, argv in (("accel", accel), ("gloo", gloo)) if r % 2 == 0 else (("gloo", gloo), ("accel", accel)):
            seen[name].append(run_csv(argv))
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    cases = sorted(seen["accel"][0], key=lambda c: (c[0] != "pingpong_roundtrip", c[1]))
    print("case,bytes,accel_median_us,accel_p90_us,gloo_median_us,gloo_p90_us,gloo_over_accel,memcpy_us,accel_vs_memcpy")
    for case in cases:
        a = [run[case] for run in seen["accel"]]
        g = [run[case] for run in seen["gloo"] if case in run]
        am, ap90 = statistics.median(x[0] for x in a), statistics.median(x[1] for x in a)
        gm, gp90 = statistics.median(x[0] for x in g), statistics.median(x[1] for x in g)
        mc = statistics.median(x[2] for x in a)
        vs = mc / am if case[0] == "bandwidth" else 0
        print(f"{case[0]},{case[1]},{am:.2f},{ap90:.2f},{gm:.2f},{gp90:.2f},{gm / am:.2f},{mc:.2f},{vs:.3f}")


if __name__ == "__main__":
    main()
