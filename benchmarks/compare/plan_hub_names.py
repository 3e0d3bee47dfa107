#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Whole-process `accel plan` on Hub-format folders (the names save_pretrained writes), two accel
binaries side by side (e.g. before and after the model-name trees), alternating runs after a
warm-up: median and p90 wall time per binary and their ratio, and whether their maps are the same.
The folders are headers-only, written from the golden-map fixtures (no torch needed): DeepSeek-V3
at its published size (bfloat16, one tensor per expert: 45k tensors), the same model as published
in block FP8 (float8 weights with their scales, the MTP layer: 163 shards, 92k tensors) and
ViT-Base.

With --floor, benchmarks/header_floor_bench runs beside them on each folder (in the same
alternation): the least any planner must do there (read every header into flat arrays and one
name table), and each binary's time as a multiple of it.

  plan_hub_names.py ACCEL_A ACCEL_B [--runs N] [--floor build/benchmarks/header_floor_bench]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "compat"))
from gen_golden_maps import read_fixture, write_checkpoint_files  # noqa: E402

FIXTURES = os.path.join(HERE, "..", "..", "tests", "compat", "fixtures")
GPUS_8 = ",".join(f"{i}=141GB" for i in range(8)) + ",cpu=2TB"


def fixture_path(folder, name):
    for ext in (".json", ".json.gz"):
        p = os.path.join(FIXTURES, folder, name + ext)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(name)


def cases():
    """(label, config, [(tensor, dtype, shape)], budgets, shards or None) per folder."""
    for arch, dtype, budgets in (("DeepseekV3ForCausalLM", "BF16", GPUS_8), ("ViTForImageClassification", "F32", "0=100MB,cpu=1GB")):
        fixture = read_fixture(fixture_path("golden_maps_published", arch))
        yield arch, fixture["config"], [(n, dtype, s) for n, s in fixture["tensors"]], budgets, None
    fixture = read_fixture(fixture_path("quantized_published", "deepseek_v3_fp8"))
    yield "DeepSeek-V3 FP8", fixture["config"], [tuple(t) for t in fixture["checkpoint_tensors"]], GPUS_8, 163  # the Hub's shards


def timed(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--floor", help="header_floor_bench binary, timed beside A and B")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for label, config, tensors, budgets, shards in cases():
            folder = os.path.join(work, label.replace(" ", "_"))
            os.makedirs(folder)
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(config, f)
            write_checkpoint_files(folder, tensors, shards=shards)
            cmds = {name: [binary, "plan", "--checkpoint", folder, "--json", "--max-memory", budgets]
                    for name, binary in (("a", args.a), ("b", args.b))}
            if args.floor:
                cmds["floor"] = [args.floor, folder]
            for c in cmds.values():  # warm-up: page cache, first touch
                timed(c)
                timed(c)
            times = {k: [] for k in cmds}
            for _ in range(args.runs):
                for k in cmds:
                    times[k].append(timed(cmds[k]))
            row = {}
            for k, xs in times.items():
                xs.sort()
                row[k] = (statistics.median(xs), xs[min(len(xs) - 1, round(0.9 * (len(xs) - 1)))])
            maps = [json.loads(subprocess.run(cmds[k], check=True, capture_output=True, text=True).stdout) for k in ("a", "b")]
            print(f"{label}: {len(tensors)} tensors; A median {row['a'][0]:.1f} ms (p90 {row['a'][1]:.1f}), "
                  f"B median {row['b'][0]:.1f} ms (p90 {row['b'][1]:.1f}); B/A {row['b'][0] / row['a'][0]:.2f} "
                  f"(p90 {row['b'][1] / row['a'][1]:.2f}); map keys A {len(maps[0])}, B {len(maps[1])}, "
                  f"{'the same map' if maps[0] == maps[1] else 'MAPS DIFFER'}", flush=True)
            if args.floor:
                floor = row["floor"]
                print(f"  floor (headers into flat arrays and one name table): median {floor[0]:.1f} ms (p90 {floor[1]:.1f}); "
                      f"A {row['a'][0] / floor[0]:.1f}x, B {row['b'][0] / floor[0]:.1f}x the floor", flush=True)


if __name__ == "__main__":
    main()
