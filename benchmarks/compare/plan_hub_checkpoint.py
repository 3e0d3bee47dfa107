#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Planning a sharded 70B-sized Hub checkpoint: whole-process `accel plan` against transformers' own
planning for the same folder (from_pretrained(folder, device_map=..., max_memory=..., dtype=...)
up to the moment its device map is computed: config, meta-device model, map), in one run.

    .venv-compat/bin/python benchmarks/compare/plan_hub_checkpoint.py build/bench/bin/accel [--runs 20]

The folder is written once into a temporary directory: config.json of Llama-3-70B's published
shape, 30 headers-only safetensors shards (sparse files: real headers, data sections are holes)
named and indexed as save_pretrained does, and model.safetensors.index.json. Budgets: two 80 GiB
GPUs and 200 GiB of CPU, bfloat16, device_map="auto". Both sides run after one warm-up run; the
transformers side runs in this process (its import is not counted, which favours it), accel's as a
fresh process each time (counted). Prints median and p90 of each and the ratio.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "compat"))
from gen_golden_maps import record_map, write_checkpoint_files  # noqa: E402  (shared with the golden maps)


def write_checkpoint(folder, torch, transformers, shards=30):
    config = transformers.LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                                      num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                                      rope_theta=500000.0, tie_word_embeddings=False, dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(folder)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    tensors = [(n, "BF16", list(t.shape)) for n, t in model.state_dict().items()]
    return len(tensors), write_checkpoint_files(folder, tensors, shards=shards)


def summary(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("accel")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    budgets = {0: 80 * GIB, 1: 80 * GIB, "cpu": 200 * GIB}
    accel_budgets = "0=%d,1=%d,cpu=%d" % (budgets[0], budgets[1], budgets["cpu"])
    with tempfile.TemporaryDirectory() as folder:
        n, total = write_checkpoint(folder, torch, transformers)
        print("checkpoint: Llama-3-70B shape, %d tensors in 30 shards, %.1f GiB (bfloat16)" % (n, total / GIB))
        accel_cmd = [args.accel, "plan", "--checkpoint", folder, "--max-memory", accel_budgets, "--dtype", "bfloat16", "--json"]
        times = {"transformers": [], "accel plan": []}
        for run in range(args.runs + 1):
            start = time.perf_counter()
            hf_map = record_map(transformers, "LlamaForCausalLM", folder, "auto", budgets, "bfloat16")
            t_hf = time.perf_counter() - start
            start = time.perf_counter()
            r = subprocess.run(accel_cmd, capture_output=True, text=True)
            t_accel = time.perf_counter() - start
            if r.returncode != 0:
                sys.exit("accel plan failed (exit %d): %s" % (r.returncode, r.stderr[-2000:]))
            if run:
                times["transformers"].append(t_hf)
                times["accel plan"].append(t_accel)
        accel_map = json.loads(r.stdout)
        same = {k: str(v) for k, v in hf_map.items()} == {k: str(v) for k, v in accel_map.items()}
        print("transformers map: %d entries; accel map: %d entries; identical: %s" % (len(hf_map), len(accel_map), "yes" if same else "no"))
        hf_med, hf_p90 = summary(times["transformers"])
        print("%-14s %10s %10s %24s" % ("case", "median ms", "p90 ms", "transformers / case"))
        for name, xs in times.items():
            med, p90 = summary(xs)
            print("%-14s %10.2f %10.2f %15.0fx (p90 %.0fx)" % (name, med * 1e3, p90 * 1e3, hf_med / med, hf_p90 / p90))


if __name__ == "__main__":
    main()
