#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Writes the fuzz harnesses' large depth and count seeds into OUTDIR/<harness>/.

Each is small and valid by its format's own limits, yet took accel minutes before its algorithms
were made linear (or the depth capped): a tensor name of 80,000 dotted parts (160 KB), 160,000
tensors at the root (a 10 MB header), a device map of 200,000 keys (5.9 MB). They are generated at
build time rather than kept in the sources, and the fuzz ctests run them with a per-input time
limit (tests/fuzz/CMakeLists.txt), so a quadratic step reached by them fails the run.

usage: large_seeds.py OUTDIR
"""
import json
import os
import struct
import sys

DEEP_PARTS = 80_000
ROOT_TENSORS = 160_000
MAP_KEYS = 200_000


def safetensors(names):
    """A file of one-element float32 tensors with these names (header space-padded to 8 bytes)."""
    header = "{" + ",".join(
        '"%s":{"dtype":"F32","shape":[1],"data_offsets":[%d,%d]}' % (n, 4 * i, 4 * i + 4) for i, n in enumerate(names)) + "}"
    header += " " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header.encode() + bytes(4 * len(names))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    deep = ".".join(["a"] * DEEP_PARTS)
    write(os.path.join(out, "checkpoint_plan", "deep_name.safetensors"), safetensors([deep]))
    write(os.path.join(out, "checkpoint_plan", "root_tensors.safetensors"), safetensors(["t%d" % i for i in range(ROOT_TENSORS)]))
    keys = {"model.layers.%d" % i: (0 if i % 3 else "cpu") for i in range(MAP_KEYS)}
    write(os.path.join(out, "device_map", "many_keys.json"), json.dumps(keys))
    skeleton = {"parameters": [{"name": deep, "shape": [1], "dtype": "float32"}]}
    write(os.path.join(out, "skeleton", "deep_name.json"), json.dumps(skeleton))


if __name__ == "__main__":
    main()
