#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""torch.distributed send/recv on gloo (CPU) between two processes: the cases of p2p_bench.cpp.

    .venv-compat/bin/python benchmarks/compare/p2p_gloo.py [--quick] [--max BYTES]

Two processes started with torch.multiprocessing, TCP rendezvous on 127.0.0.1, gloo backend, uint8
tensors. Latency: 8-byte ping-pong, each round trip timed on rank 0. Bandwidth: rank 0 sends
`bytes`, rank 1 answers with 8 bytes, each exchange timed on rank 0. Warm-up first. Prints the CSV
of p2p_bench (impl,case,bytes,iters,median_us,p90_us,MB_per_s,memcpy_median_us,vs_memcpy), with
torch's own tensor copy (copy_) of the same size as the memcpy reference.
"""
import argparse
import os
import socket
import time


def percentile(values, p):
    values = sorted(values)
    return values[int(p * (len(values) - 1))]


def run(rank, port, quick, max_bytes):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    peer = 1 - rank
    small = torch.full((8,), 7, dtype=torch.uint8)
    echo = torch.empty(8, dtype=torch.uint8)
    if rank == 0:
        print("impl,case,bytes,iters,median_us,p90_us,MB_per_s,memcpy_median_us,vs_memcpy", flush=True)
    warm, iters = (200, 2000) if quick else (1000, 10000)
    times = []
    for i in range(warm + iters):
        start = time.perf_counter()
        if rank == 0:
            dist.send(small, peer)
            dist.recv(echo, peer)
        else:
            dist.recv(echo, peer)
            dist.send(echo, peer)
        if i >= warm:
            times.append((time.perf_counter() - start) * 1e6)
    if rank == 0:
        print("gloo,pingpong_roundtrip,8,%d,%.2f,%.2f,0,0,0" % (iters, percentile(times, 0.5), percentile(times, 0.9)), flush=True)
    nbytes = 1024
    while nbytes <= max_bytes:
        buf = torch.full((nbytes,), rank + 1, dtype=torch.uint8)
        budget = 2e5 if quick else 1e6
        iters = int(min(2000, max(5, budget / (nbytes / 2000.0 + 10.0))))
        warm = max(2, iters // 10)
        times = []
        for i in range(warm + iters):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(echo, peer)
            else:
                dist.recv(buf, peer)
                dist.send(small, peer)
            if i >= warm:
                times.append((time.perf_counter() - start) * 1e6)
        if rank == 1 and int(buf[-1]) != 1:
            raise SystemExit("rank 1 received wrong data")
        if rank == 0:
            other = torch.empty_like(buf)
            copies = []
            for _ in range(min(iters, 50) + 2):
                t0 = time.perf_counter()
                other.copy_(buf)
                copies.append((time.perf_counter() - t0) * 1e6)
            mc = percentile(copies[2:], 0.5)
            med = percentile(times, 0.5)
            print("gloo,bandwidth,%d,%d,%.2f,%.2f,%.1f,%.2f,%.3f" % (nbytes, iters, med, percentile(times, 0.9), nbytes / med, mc, mc / med),
                  flush=True)
        nbytes *= 4
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--max", type=int, default=256 << 20)
    args = ap.parse_args()
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(port, args.quick, args.max), nprocs=2, join=True)


if __name__ == "__main__":
    main()
