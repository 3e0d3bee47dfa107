#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""Python peers for benchmarks/load_bench.cpp: loads every *.safetensors file of a folder into CPU
memory and prints {"bytes": N, "safetensors_s": t, "torch_s": t} as JSON (a key is null when the
package is not importable).

safetensors_s: safetensors.torch.load_file per shard (what transformers does for CPU loads; the
               tensors are lazily mapped, so one byte per page is touched, as load_bench does).
safetensors_copy_s: the same, each tensor then cloned into process memory (materialised).
torch_s:       plain torch: read the file into a bytearray, parse the header, torch.frombuffer per
               tensor (the fastest pure-torch route; no safetensors package needed).
Best of `repeats` runs each (default 3)."""
import glob
import json
import os
import struct
import sys
import time


def bytes_of(files):
    return sum(os.path.getsize(f) for f in files)


def touch(t):
    # one byte per 4 KiB page, so lazily mapped tensors are really read (as load_bench does)
    import torch
    if t.numel():
        int(t.reshape(-1).view(torch.uint8)[::4096].sum())


def run_safetensors(files):
    from safetensors.torch import load_file
    total = 0
    for f in files:
        sd = load_file(f, device="cpu")
        for t in sd.values():
            touch(t)
        total += sum(t.numel() * t.element_size() for t in sd.values())
        del sd
    return total


def run_safetensors_copy(files):
    from safetensors.torch import load_file
    total = 0
    for f in files:
        sd = {k: v.clone() for k, v in load_file(f, device="cpu").items()}  # materialised in process memory
        total += sum(t.numel() * t.element_size() for t in sd.values())
        del sd
    return total


def run_torch(files):
    import torch
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "I64": torch.int64,
              "I32": torch.int32, "U8": torch.uint8, "I8": torch.int8, "BOOL": torch.bool, "F64": torch.float64}
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = bytearray(os.path.getsize(f) - 8 - n)
            view = memoryview(data)
            got = 0
            while got < len(data):
                r = fh.readinto(view[got:])
                if not r:
                    raise IOError(f"{f}: short read")
                got += r
        tensors = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            if e > b:
                dt = dtypes[info["dtype"]]
                size = torch.empty((), dtype=dt).element_size()  # torch 1.13 has no dtype.itemsize
                tensors[name] = torch.frombuffer(data, dtype=dt, count=(e - b) // size, offset=b).reshape(info["shape"])
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors, data
    return total


def best(fn, files, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(files)
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__ + "\n\nusage: load_safetensors.py FOLDER [REPEATS]")
        return 0 if len(sys.argv) > 1 else 2
    folder = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    out = {"bytes": bytes_of(files), "safetensors_s": None, "safetensors_copy_s": None, "torch_s": None}
    try:
        import safetensors.torch  # noqa: F401
        out["safetensors_s"] = best(run_safetensors, files, repeats)
        out["safetensors_copy_s"] = best(run_safetensors_copy, files, repeats)
    except ImportError:
        pass
    try:
        import torch  # noqa: F401
        out["torch_s"] = best(run_torch, files, repeats)
    except ImportError:
        pass
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
