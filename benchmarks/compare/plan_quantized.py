#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Planning DeepSeek-V3 671B FP8 (the published checkpoint's headers: 163 shards, 91,991 tensors,
written sparse from tests/compat/fixtures/quantized_published) on 8 GPUs of 141 GB, side by side:
accel (whole-process `accel plan --json`) and transformers 5 (from_pretrained with its FP8
quantizer on the meta device, CUDA faked for the planning step as gen_quantized.py does, timed from
the call until _get_device_map returns: config, quantizer, meta model, balancing, map). Alternating
runs after a warm-up; median and p90 per side and the ratio of medians. Both maps are checked equal.

  plan_quantized.py ACCEL_BINARY [--runs N]     (run with the compat venv's Python: torch, transformers)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(HERE, "..", "..", "tests", "compat")
sys.path.insert(0, COMPAT)
from gen_golden_maps import read_fixture, write_checkpoint_files  # noqa: E402

PUBLISHED_SHARDS = 163  # model-00001-of-000163.safetensors ... on the Hub
sys.path.insert(0, HERE)
from plan_hub_checkpoint import summary  # noqa: E402  (median and p90, as the other planning benchmark)

FIXTURE = os.path.join(COMPAT, "fixtures", "quantized_published", "deepseek_v3_fp8.json.gz")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("accel")
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    import transformers
    from gen_quantized import capture_map
    transformers.logging.set_verbosity_error()
    fixture = read_fixture(FIXTURE)
    scenario = fixture["maps"][0]
    budgets = {k if k == "cpu" else int(k): v for k, v in scenario["max_memory"].items()}
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(fixture["config"], f)
        write_checkpoint_files(folder, [tuple(t) for t in fixture["checkpoint_tensors"]], shards=PUBLISHED_SHARDS)
        cmd = [args.accel, "plan", "--checkpoint", folder, "--json", "--device-map", scenario["device_map"],
               "--max-memory", json.dumps(scenario["max_memory"])]

        def run_accel():
            t = time.perf_counter()
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            return (time.perf_counter() - t) * 1e3, json.loads(out)

        def run_transformers():
            t = time.perf_counter()
            got = capture_map(fixture["architecture"], folder, scenario["device_map"], budgets, "auto", "fp8")
            return (time.perf_counter() - t) * 1e3, got["result"]

        _, ours = run_accel()  # warm-up: page cache, first touch, imports
        _, theirs = run_transformers()
        if ours != theirs:
            print("maps differ:", json.dumps(ours), json.dumps(theirs), file=sys.stderr)
            return 1
        times = {"accel": [], "transformers": []}
        for _ in range(args.runs):
            times["accel"].append(run_accel()[0])
            times["transformers"].append(run_transformers()[0])
    (a, a90), (t, t90) = summary(times["accel"]), summary(times["transformers"])
    print(f"DeepSeek-V3 FP8 671B ({len(fixture['checkpoint_tensors'])} tensors), 8 x 141 GB, mode "
          f"{scenario['device_map']}, {args.runs} runs each; maps identical")
    print(f"  accel plan (process):        median {a:9.1f} ms  p90 {a90:9.1f} ms")
    print(f"  transformers from_pretrained: median {t:9.1f} ms  p90 {t90:9.1f} ms")
    print(f"  ratio of medians: transformers / accel = {t / a:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
