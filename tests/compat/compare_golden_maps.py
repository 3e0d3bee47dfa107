#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Plans every golden-map scenario with `accel plan --json` (from the fixture's headers-only
checkpoint and config.json) and prints how many checkpoint tensors land where transformers put
them. Expected to differ until the planner reads the architecture catalog; it fails only when
accel plan itself fails or a fixture is malformed.

  compare_golden_maps.py ACCEL_BINARY [FIXTURE_DIR]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_golden_maps import write_headers_only  # noqa: E402  (pure Python; needs no torch)

CATALOG = os.path.join(os.path.dirname(os.path.dirname(HERE)), "include/accel/model/data/catalog.json")


def device_of(name, device_map):
    """The device of a tensor under an HF device map (longest matching key wins)."""
    best, where = -1, None
    for key, value in device_map.items():
        if key == "" or name == key or name.startswith(key + "."):
            if len(key) > best:
                best, where = len(key), value
    return where


def main():
    accel = sys.argv[1]
    folder = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "fixtures", "golden_maps")
    with open(CATALOG) as f:
        no_split = {a["architecture"]: a["no_split_modules"] for a in json.load(f)["architectures"]}
    agree_all = total_all = maps_equal = maps = 0
    for file in sorted(os.listdir(folder)):
        with open(os.path.join(folder, file)) as f:
            fixture = json.load(f)
        arch = fixture["architecture"]
        for scenario in fixture["maps"]:
            tensors = fixture["checkpoints"][scenario["checkpoint_dtype"]]
            with tempfile.TemporaryDirectory() as ckpt:
                with open(os.path.join(ckpt, "config.json"), "w") as f:
                    json.dump(fixture["config"], f)
                write_headers_only(os.path.join(ckpt, "model.safetensors"), [tuple(t) for t in tensors])
                cmd = [accel, "plan", "--checkpoint", ckpt, "--json", "--device-map", scenario["device_map"],
                       "--max-memory", json.dumps(scenario["max_memory"])]
                if scenario["dtype"] != "auto":
                    cmd += ["--dtype", scenario["dtype"]]
                for cls in no_split[arch]:
                    cmd += ["--no-split", cls]
                run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{arch} {scenario['name']}: accel plan failed ({run.returncode}): {run.stderr.strip()}")
                return 1
            ours, theirs = json.loads(run.stdout), scenario["result"]
            agree = sum(device_of(n, ours) == device_of(n, theirs) for n, _, _ in tensors)
            agree_all += agree
            total_all += len(tensors)
            maps += 1
            maps_equal += agree == len(tensors)
            print(f"{arch} {scenario['name']}: {agree}/{len(tensors)} tensors agree")
    print(f"golden maps: {maps_equal}/{maps} maps agree on every tensor; {agree_all}/{total_all} tensors agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
