#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Time per generated token of examples/llama_generate, fit map against speed map, on the same budgets,
with the ratio the plan predicts beside the measured one.

A random Llama (bfloat16, untied embedding; examples/make_demo_checkpoint.py) is planned with
`accel plan --json-report` (both objectives' bytes streamed per forward pass), then decoded by
llama_generate with each objective in turn, alternating, several runs each after a warm-up run. Each
run reports the median and p90 of its per-token decode times; the table gives the median over runs
of each, the ratio of medians fit/speed, and the predicted ratio of the transfer estimates.

On a machine without a GPU the GPUs are host-simulated: a "transfer" is the loader's staging copies
in host memory, and the disk tensors are views of a checkpoint that sits in the page cache, so the
prediction uses one rate for cpu and disk (--rate, default: the host copy rate accel env measures
here) and the per-token time includes the example's CPU arithmetic, which both maps share. The order
of the two objectives must agree between prediction and measurement; the script exits 1 where it
does not.

usage: forward_objective.py BUILD_DIR [--work DIR] [--runs N] [--tokens N] [--rate BYTES_PER_S]
       (BUILD_DIR has bin/accel and examples/llama_generate)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# name, GPU budgets (MiB), cpu budget (MiB): the model is 148.5 MiB, its largest layers (the embedding
# and the head) 31.25 MiB each. Budgets where the fit map leaves GPU 0 empty are left out: its
# execution GPU is then GPU 1, which has no room for the fetch buffers (the load fails, as
# transformers' run would when it moves the offloaded head there).
SCENARIOS = [
    ("GPUs hold ~75%", [96, 16], 40),
    ("GPUs hold ~85%", [104, 24], 40),
    ("GPUs hold ~100%", [120, 32], 32),
]
MODEL = ["--layers", "16", "--hidden", "512", "--intermediate", "1408", "--vocab", "32000", "--heads", "8",
         "--kv-heads", "2", "--untied"]
PROMPT = "1,17,254,3,99,480,12,7"


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res.stdout


def measured_rate(accel):
    out = run([accel, "env", "--measure-bandwidth", "--disk-dir", "/tmp"])
    m = re.search(r"host to GPU: +([\d.]+) GiB/s", out)
    return float(m.group(1)) * 2**30 if m else 10e9


def decode_times(generate, checkpoint, budgets, objective, tokens):
    gpus, cpu = budgets
    mm = ",".join(f"{i}={b}MiB" for i, b in enumerate(gpus)) + f",cpu={cpu}MiB"
    sim = ",".join(f"{b}MiB" for b in gpus)
    out = run([generate, "--checkpoint", checkpoint, "--prompt", PROMPT, "--new-tokens", str(tokens),
               "--simulate-gpus", sim, "--max-memory", mm, "--objective", objective])
    m = re.search(r"decode median ([\d.]+) ms/token \(p90 ([\d.]+)\), (\d+) bytes streamed/token", out)
    if not m:
        sys.exit(f"no decode line in:\n{out}")
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--work", default=None, help="where the checkpoint goes (default BUILD_DIR/forward-bench)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=9)
    ap.add_argument("--rate", type=float, default=None, help="bytes/s for cpu and disk in the prediction")
    args = ap.parse_args()
    accel = os.path.join(args.build, "bin", "accel")
    generate = os.path.join(args.build, "examples", "llama_generate")
    work = args.work or os.path.join(args.build, "forward-bench")
    checkpoint = os.path.join(work, "llama-148MiB")
    run([sys.executable, os.path.join(ROOT, "examples", "make_demo_checkpoint.py"), checkpoint, *MODEL])
    rate = args.rate or measured_rate(accel)
    print(f"model: {checkpoint} (148.5 MiB bfloat16, 16 layers, untied 32000 x 512 embedding); "
          f"{args.runs} runs per objective after a warm-up, {args.tokens} tokens each (the first is the prompt)")
    print(f"prediction: transfer time at {rate / 1e9:.2f} GB/s for cpu and disk alike\n")
    print(f"{'scenario':<16} {'budgets (MiB)':<22} {'objective':<9} {'streamed/token':>15} {'predicted':>10} "
          f"{'median ms':>10} {'p90 ms':>8}")
    disagreements = 0
    for name, gpus, cpu in SCENARIOS:
        mm = ",".join(f"{i}={b}MiB" for i, b in enumerate(gpus)) + f",cpu={cpu}MiB"
        report = json.loads(run([accel, "plan", "--checkpoint", checkpoint, "--max-memory", mm, "--gpu-reserve-layers", "2",
                                 "--objective", "speed", "--json-report", "--bandwidth", f"cpu={rate / 1e6:.0f}MB/s,disk={rate / 1e6:.0f}MB/s"]))
        predicted = {o: report["streamed_per_forward_pass"][o]["seconds"] for o in ("fit", "speed")}
        samples = {"fit": [], "speed": []}
        for objective in ("fit", "speed"):
            decode_times(generate, checkpoint, (gpus, cpu), objective, 3)  # warm-up: page cache, first touch
        for _ in range(args.runs):
            for objective in ("fit", "speed"):
                samples[objective].append(decode_times(generate, checkpoint, (gpus, cpu), objective, args.tokens))
        med = {}
        for objective in ("fit", "speed"):
            runs = samples[objective]
            med[objective] = statistics.median(r[0] for r in runs)
            p90 = statistics.median(r[1] for r in runs)
            print(f"{name:<16} {mm.replace('MiB', ''):<22} {objective:<9} {runs[0][2]:>15,} "
                  f"{predicted[objective] * 1e3:>8.2f}ms {med[objective]:>10.2f} {p90:>8.2f}")
        pred_ratio = predicted["fit"] / predicted["speed"] if predicted["speed"] > 0 else float("inf")
        meas_ratio = med["fit"] / med["speed"]
        agree = (pred_ratio > 1) == (meas_ratio > 1) or (pred_ratio == 1 and abs(meas_ratio - 1) < 0.05)
        disagreements += not agree
        print(f"{'':<16} fit/speed: predicted transfer {pred_ratio:.2f}x, measured per token {meas_ratio:.2f}x "
              f"({'same order' if agree else 'ORDER DISAGREES'})\n")
    sys.exit(1 if disagreements else 0)


if __name__ == "__main__":
    main()
