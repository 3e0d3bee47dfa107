#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Times accelerate's infer_auto_device_map on the skeletons benchmarks/gen_skeletons.py writes, with
the budgets and no-split class planner_bench.cpp uses, and writes each map as JSON so the C++ map can
be compared with it.

usage: PYTHONPATH=<dir with accelerate> /usr/bin/python3 planner_accelerate.py SKELETON_DIR OUT_DIR [names...]
(the model is built on the meta device: no weights are allocated)
"""
import json
import os
import sys
import time

import torch
from accelerate.utils import infer_auto_device_map

CASES = {
    "llama2_70b": ({0: "24GiB", 1: "24GiB", 2: "24GiB", 3: "24GiB", "cpu": "24GiB"}, "LlamaDecoderLayer"),
    "layers_1000": ({0: "5GiB", 1: "5GiB", 2: "5GiB", 3: "5GiB", "cpu": "2GiB"}, "LlamaDecoderLayer"),
    "moe_173k": ({0: "16GiB", 1: "16GiB", 2: "16GiB", 3: "16GiB", "cpu": "16GiB"}, "MoeDecoderLayer"),
}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int64": torch.int64,
          # torch 1.13 has no float8: a one-byte integer has the same size (no dtype conversion is asked).
          "float8_e4m3fn": torch.uint8}
_classes = {}


def module_class(name):
    if name not in _classes:
        _classes[name] = type(name or "Module", (torch.nn.Module,), {})
    return _classes[name]


def build(skel):
    classes = {m["name"]: m.get("class", "") for m in skel["modules"]}
    root = module_class(classes.get("", ""))()
    mods = {"": root}

    def get(name):
        if name in mods:
            return mods[name]
        parent, _, local = name.rpartition(".")
        m = module_class(classes.get(name, ""))()
        get(parent).add_module(local, m)
        mods[name] = m
        return m

    for m in skel["modules"]:
        if m["name"]:
            get(m["name"])
    for p in skel["parameters"]:
        owner, _, local = p["name"].rpartition(".")
        t = torch.empty(p["shape"], dtype=DTYPES[p["dtype"]], device="meta")
        get(owner).register_parameter(local, torch.nn.Parameter(t, requires_grad=False))
    for b in skel["buffers"]:
        owner, _, local = b["name"].rpartition(".")
        t = torch.empty(b["shape"], dtype=DTYPES[b["dtype"]], device="meta")
        get(owner).register_buffer(local, t, persistent=b.get("persistent", True))
    return root


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    skel_dir, out_dir = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(CASES)
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        budgets, block = CASES[name]
        with open(os.path.join(skel_dir, name + ".json")) as f:
            model = build(json.load(f))
        runs = []
        for _ in range(3 if name != "moe_173k" else 1):
            t0 = time.perf_counter()
            dm = infer_auto_device_map(model, max_memory=dict(budgets), no_split_module_classes=[block])
            runs.append(time.perf_counter() - t0)
        with open(os.path.join(out_dir, name + ".accelerate.json"), "w") as f:
            json.dump(dm, f)
        print(f"{name}: best of {len(runs)}: {min(runs) * 1e3:.1f} ms, {len(dm)} map entries", flush=True)


if __name__ == "__main__":
    sys.exit(main())
