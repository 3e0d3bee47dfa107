#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Reads and writes offload folders exactly the way accelerate's utils/offload.py does
(np.memmap per tensor, bf16 as int16 bits, 0-d tensors as shape (1,)), so tests can check that
accel's folders are interchangeable with accelerate's.

  accelerate_offload.py read FOLDER   -> prints {name: {"dtype", "shape", "fnv"}} as JSON
  accelerate_offload.py write FOLDER  -> writes a folder of known tensors, prints the same JSON
"""
import json
import os
import sys

import numpy as np
import torch


def fnv1a(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def load_offloaded_weight(weight_file, weight_info):  # accelerate's reader, step by step
    shape = tuple(weight_info["shape"])
    if shape == ():
        shape = (1,)
    dtype = weight_info["dtype"]
    if dtype == "bfloat16":
        dtype = "int16"
    weight = np.memmap(weight_file, dtype=dtype, shape=shape, mode="r")
    if len(weight_info["shape"]) == 0:
        weight = weight[0]
    weight = torch.tensor(weight)
    if weight_info["dtype"] == "bfloat16":
        weight = weight.view(torch.bfloat16)
    return weight


def offload_weight(weight, weight_name, offload_folder, index):  # accelerate's writer
    dtype = None
    if str(weight.dtype) == "torch.bfloat16":
        weight = weight.view(torch.int16)
        dtype = "bfloat16"
    array = weight.cpu().numpy()
    tensor_file = os.path.join(offload_folder, f"{weight_name}.dat")
    if dtype is None:
        dtype = str(array.dtype)
    index[weight_name] = {"dtype": dtype, "shape": list(array.shape)}
    if array.ndim == 0:
        array = array[None]
    file_array = np.memmap(tensor_file, dtype=array.dtype, mode="w+", shape=array.shape)
    file_array[:] = array[:]
    file_array.flush()


def describe(name, t):
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    data = raw.contiguous().numpy().tobytes()
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "fnv": fnv1a(data)}


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    out = {}
    if mode == "read":
        with open(os.path.join(folder, "index.json")) as f:
            index = json.load(f)
        for name, info in index.items():
            out[name] = describe(name, load_offloaded_weight(os.path.join(folder, f"{name}.dat"), info))
    else:
        os.makedirs(folder, exist_ok=True)
        g = torch.Generator().manual_seed(3)
        tensors = {
            "model.embed.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
            "model.layers.0.w": torch.randn(3, 4, generator=g).to(torch.float16),
            "model.layers.0.b": torch.randn(9, generator=g),
            "model.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3),
            "model.mask": torch.tensor([True, False, True]),
            "model.scale": torch.tensor(2.5),
        }
        index = {}
        for name, t in tensors.items():
            offload_weight(t, name, folder, index)
            out[name] = describe(name, t)
        with open(os.path.join(folder, "index.json"), "w") as f:
            json.dump(index, f, indent=2)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
