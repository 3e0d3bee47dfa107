#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: accel contributors
"""torch.distributed all_gather_object and all_reduce (gloo, CPU) on the payloads of
collectives_bench, in the same run, and the ratio to accel's gather_object / all_reduce.

    /usr/bin/python3 benchmarks/compare/torch_gather.py build/dev/benchmarks/collectives_bench [--procs 2,4] [--quick]
        [--case all_reduce ...] [--size 100 ...]

Runs collectives_bench first (accel), then the same cases with torch: N processes started with
torch.multiprocessing, TCP rendezvous on 127.0.0.1, gloo backend. Prints both CSVs and a table of
time per call (mean, median and p90 over the iterations rank 0 timed) and accel's speed-up
(torch time / accel time) for each.
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


def make_records(count, rank):
    """The records of collectives_bench's records_* cases, as tuples (id, score, text, tokens)."""
    return [(i, 0.5 * i, "completion text for prompt %d" % (rank * 1000000 + i), [1, 2, 3, i]) for i in range(count)]


def iterations(nbytes, structs, quick):
    if structs:
        n = 200 if nbytes <= 1024 else 30 if nbytes <= 65536 else 3 if nbytes <= (1 << 20) else 1
    else:
        n = 400 if nbytes <= 1024 else 100 if nbytes <= (1 << 20) else 5
    return max(1, n // 10) if quick else n


def all_reduce_iterations(nbytes, quick):
    return 5 if quick else 100 if nbytes <= (1 << 20) else 30 if nbytes <= (16 << 20) else 15  # as collectives_bench


def worker(rank, world, port, quick, cases, sizes, queue):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)

    def timed(iters, op):
        """(mean, median, p90) microseconds per call, each call timed as collectives_bench does."""
        op()
        dist.barrier()
        each = []
        t0 = last = time.perf_counter()
        for _ in range(iters):
            op()
            now = time.perf_counter()
            each.append((now - last) * 1e6)
            last = now
        each.sort()
        return ((last - t0) / iters * 1e6, each[len(each) // 2], each[min(len(each) - 1, int(0.9 * len(each)))])

    def wants(case):
        return not cases or case in cases

    rows = []
    out = [None] * world
    bi = 100 if quick else 1000
    if wants("barrier"):
        rows.append(("barrier", 0, bi, timed(bi, dist.barrier)))
    for nbytes in (100, 64 << 10, 1 << 20, 16 << 20):
        if sizes and nbytes not in sizes:
            continue
        if wants("raw_bytes"):
            raw = bytes([rank % 256]) * nbytes
            ri = iterations(nbytes, False, quick)
            rows.append(("raw_bytes", nbytes, ri, timed(ri, lambda: dist.all_gather_object(out, raw))))
        if wants("struct_list") or wants("struct_fields"):
            items = make_items(nbytes, rank)
            si = iterations(nbytes, True, quick)
            rows.append(("struct_list", nbytes, si, timed(si, lambda: dist.all_gather_object(out, items))))
    if wants("records"):
        for count in (1000, 100000):
            recs = make_records(count, rank)
            ri = 5 if quick else 200 if count <= 1000 else 20
            rows.append(("records", count, ri, timed(ri, lambda: dist.all_gather_object(out, recs))))
    if wants("records_flat"):  # accelerate's gather_object on lists: all_gather_object, then one list
        for count in (1000, 100000):
            recs = make_records(count, rank)
            ri = 5 if quick else 200 if count <= 1000 else 20

            def gather_flat():
                dist.all_gather_object(out, recs)
                return [x for part in out for x in part]
            rows.append(("records_flat", count, ri, timed(ri, gather_flat)))
    if wants("all_reduce"):
        for nbytes in (1 << 20, 16 << 20, 64 << 20):
            if sizes and nbytes not in sizes:
                continue
            t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32)
            dist.all_reduce(t)
            expect = world * (world + 1) / 2
            if t[0].item() != expect or t[-1].item() != expect:
                raise SystemExit("torch all_reduce returned %g, expected %g" % (t[0].item(), expect))
            t.zero_()  # as collectives_bench: the timed sums stay finite
            ai = all_reduce_iterations(nbytes, quick)
            rows.append(("all_reduce", nbytes, ai, timed(ai, lambda: dist.all_reduce(t))))
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def torch_peer(case):
    """The torch case an accel case is compared with: struct_fields (the same items declared with
    ACCEL_DEFINE_FIELDS) against the list of dicts torch's struct_list sends, the records_* cases
    (payload: records per process) against torch's same tuples (records_flat*: gather_object_flat
    against all_gather_object and one list, as accelerate's gather_object), raw_bytes_into (gather_object_into)
    against torch's raw_bytes; the others against the torch case of their name."""
    if case == "struct_fields":
        return "struct_list"
    for family in ("records_flat", "records", "raw_bytes"):
        if case.startswith(family):
            return family
    return case


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_torch(world, quick, cases, sizes):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, quick, cases, sizes, queue)) for r in range(world)]
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
    ap.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    ap.add_argument("--size", action="append", default=[], type=int, help="run only this payload size in bytes (repeatable)")
    a = ap.parse_args()
    worlds = [int(x) for x in a.procs.split(",")]
    args = [a.bench, "--procs", a.procs] + (["--quick"] if a.quick else [])
    for c in a.case:
        args += ["--case", c]
    for n in a.size:
        args += ["--size", str(n)]
    torch_cases = [torch_peer(c) for c in a.case]
    ours = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    print(ours, end="")
    accel = {}
    for row in csv.DictReader(io.StringIO(ours)):
        accel[(row["case"], int(row["procs"]), int(row["payload_bytes"]))] = tuple(
            float(row[k]) for k in ("mean_us", "median_us", "p90_us"))
    import torch
    print("# torch %s, gloo" % torch.__version__)
    torch_rows = {}
    for w in worlds:
        for case, nbytes, iters, (mean, median, p90) in run_torch(w, a.quick, torch_cases, a.size):
            rate = nbytes / median if case == "all_reduce" else nbytes * w / mean
            print("torch,%s,%d,%d,%d,%.1f,%.1f,%.1f,%.1f" % (case, w, nbytes, iters, mean, rate, median, p90))
            torch_rows[(case, w, nbytes)] = (mean, median, p90)
    print()
    print("%-13s %5s %10s %12s %12s %7s %12s %12s %7s %12s %12s %7s" % (
        "case", "procs", "payload", "accel mean", "torch mean", "ratio", "accel med", "torch med", "ratio",
        "accel p90", "torch p90", "ratio"))
    for key in sorted(accel, key=lambda k: (k[1], k[0], k[2])):
        peer = (torch_peer(key[0]),) + key[1:]
        if peer in torch_rows:
            ours_t, theirs = accel[key], torch_rows[peer]
            cells = []
            for i in range(3):
                cells += [ours_t[i], theirs[i], theirs[i] / ours_t[i] if ours_t[i] else 0.0]
            print(("%-13s %5d %10d" + " %12.1f %12.1f %6.1fx" * 3) % ((key[0], key[1], key[2]) + tuple(cells)))


if __name__ == "__main__":
    sys.exit(main())
