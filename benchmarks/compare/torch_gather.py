#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""torch.distributed all_gather_object (gloo, CPU) on the payloads of collectives_bench, in the same
run, and the ratio to accel's gather_object.

    /usr/bin/python3 benchmarks/compare/torch_gather.py build/dev/benchmarks/collectives_bench [--procs 2,4] [--quick]

Runs collectives_bench first (accel), then the same cases with torch: N processes started with
torch.multiprocessing, TCP rendezvous on 127.0.0.1, gloo backend. Prints both CSVs and a table of
mean time per call and accel's speed-up (torch time / accel time).
"""
import argparse
import csv
import io
import os
import socket
import subprocess
import sys
import time

ITEM_BYTES = 70  # keep in step with collectives_bench.cpp


def make_items(nbytes, rank):
    n = max(1, nbytes // ITEM_BYTES)
    return [{"id": i, "score": 0.5 * i, "text": "completion text for prompt %d" % (rank * 1000000 + i),
             "tokens": [1, 2, 3, i]} for i in range(n)]


def iterations(nbytes, structs, quick):
    if structs:
        n = 200 if nbytes <= 1024 else 30 if nbytes <= 65536 else 3 if nbytes <= (1 << 20) else 1
    else:
        n = 400 if nbytes <= 1024 else 100 if nbytes <= 65536 else 20 if nbytes <= (1 << 20) else 5
    return max(1, n // 10) if quick else n


def worker(rank, world, port, quick, queue):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)

    def timed(iters, op):
        op()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            op()
        return (time.perf_counter() - t0) / iters * 1e6

    rows = []
    out = [None] * world
    bi = 100 if quick else 1000
    rows.append(("barrier", 0, bi, timed(bi, dist.barrier)))
    for nbytes in (100, 64 << 10, 1 << 20, 16 << 20):
        raw = bytes([rank % 256]) * nbytes
        ri = iterations(nbytes, False, quick)
        rows.append(("raw_bytes", nbytes, ri, timed(ri, lambda: dist.all_gather_object(out, raw))))
        items = make_items(nbytes, rank)
        si = iterations(nbytes, True, quick)
        rows.append(("struct_list", nbytes, si, timed(si, lambda: dist.all_gather_object(out, items))))
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_torch(world, quick):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, quick, queue)) for r in range(world)]
    for p in procs:
        p.start()
    rows = queue.get()
    for p in procs:
        p.join()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", help="path of the collectives_bench binary")
    ap.add_argument("--procs", default="2,4")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    worlds = [int(x) for x in a.procs.split(",")]
    args = [a.bench, "--procs", a.procs] + (["--quick"] if a.quick else [])
    ours = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    print(ours, end="")
    accel = {}
    for row in csv.DictReader(io.StringIO(ours)):
        accel[(row["case"], int(row["procs"]), int(row["payload_bytes"]))] = float(row["mean_us"])
    import torch
    print("# torch %s, gloo" % torch.__version__)
    torch_rows = {}
    for w in worlds:
        for case, nbytes, iters, us in run_torch(w, a.quick):
            received = nbytes * w
            print("torch,%s,%d,%d,%d,%.1f,%.1f" % (case, w, nbytes, iters, us, received / us if us else 0.0))
            torch_rows[(case, w, nbytes)] = us
    print()
    print("%-13s %5s %10s %14s %14s %9s" % ("case", "procs", "payload", "accel us", "torch us", "speed-up"))
    for key in sorted(accel, key=lambda k: (k[1], k[0], k[2])):
        # accel's struct_fields (the same items declared with ACCEL_DEFINE_FIELDS) against the same
        # list of dicts that torch's struct_list sends.
        peer = ("struct_list",) + key[1:] if key[0] == "struct_fields" else key
        if peer in torch_rows:
            print("%-13s %5d %10d %14.1f %14.1f %8.1fx" % (key[0], key[1], key[2], accel[key], torch_rows[peer],
                                                           torch_rows[peer] / accel[key]))


if __name__ == "__main__":
    sys.exit(main())
