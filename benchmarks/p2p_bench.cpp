// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Point-to-point between two processes on the CPU backend: ping-pong latency of an 8-byte message
// and bandwidth of one message from 1 KiB to 256 MiB, with one memcpy of the same size as reference.
//
//   accel launch --cpu --num_processes 2 p2p_bench [--quick] [--max BYTES]
//
// Latency: rank 0 sends 8 bytes, rank 1 sends them back; each round trip timed on rank 0.
// Bandwidth: rank 0 sends `bytes`, rank 1 answers with 8 bytes once it has them all; each such
// exchange timed on rank 0 (so it includes one small message back). Both after a warm-up; rank 0
// prints one CSV line per case:
//   impl,case,bytes,iters,median_us,p90_us,MB_per_s,memcpy_median_us,vs_memcpy
// where MB/s = bytes / median, memcpy_median_us = one memcpy of `bytes` between two warm buffers
// in rank 0, and vs_memcpy = memcpy time / message time (1.0: a message costs one memcpy). For the
// latency case median_us is the round trip and MB_per_s is 0. benchmarks/compare/p2p_gloo.py runs
// the same with torch.distributed send/recv on gloo.
#include <accel/accel.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double memcpy_median_us(std::size_t bytes, int iters) {
  std::vector<std::uint8_t> a(bytes, 1), b(bytes, 2);
  std::vector<double> t;
  for (int i = 0; i < iters + 2; ++i) {
    const auto start = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    const auto us = micros(Clock::now() - start);
    if (i >= 2) t.push_back(us);
    a[i % bytes] = b[(i + 1) % bytes];  // keep the copies observable
  }
  return percentile(t, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::size_t max_bytes = std::size_t{256} << 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--max") == 0 && i + 1 < argc) max_bytes = std::strtoull(argv[++i], nullptr, 10);
  }
  accel::DistributedState state;
  accel::Communicator& comm = accel::communicator(state);
  if (comm.size() != 2) {
    std::fprintf(stderr, "p2p_bench runs as 2 processes: accel launch --cpu --num_processes 2 p2p_bench\n");
    return 2;
  }
  const int me = comm.rank(), peer = 1 - me;
  std::vector<std::uint8_t> small(8, 7), echo(8);
  if (me == 0) std::printf("impl,case,bytes,iters,median_us,p90_us,MB_per_s,memcpy_median_us,vs_memcpy\n");

  // Latency: 8-byte ping-pong.
  {
    const int warm = quick ? 200 : 2000, iters = quick ? 2000 : 20000;
    std::vector<double> t;
    t.reserve(static_cast<std::size_t>(iters));
    for (int i = 0; i < warm + iters; ++i) {
      const auto start = Clock::now();
      if (me == 0) {
        accel::send(comm, std::span(small), peer);
        accel::recv(comm, std::span(echo), peer);
      } else {
        accel::recv(comm, std::span(echo), peer);
        accel::send(comm, std::span(echo), peer);
      }
      if (i >= warm) t.push_back(micros(Clock::now() - start));
    }
    if (me == 0)
      std::printf("accel,pingpong_roundtrip,8,%d,%.2f,%.2f,0,%.3f,0\n", iters, percentile(t, 0.5), percentile(t, 0.9), memcpy_median_us(8, 1000));
  }

  // Bandwidth: one message of `bytes`, then 8 bytes back.
  for (std::size_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    std::vector<std::uint8_t> buf(bytes, static_cast<std::uint8_t>(me + 1));
    const double budget_us = quick ? 2e5 : 1e6;
    // Iterations: about `budget_us` of messages at 2 GB/s, between 5 and 2000.
    const int iters = static_cast<int>(std::clamp(budget_us / (static_cast<double>(bytes) / 2000.0 + 10.0), 5.0, 2000.0));
    const int warm = std::max(2, iters / 10);
    std::vector<double> t;
    for (int i = 0; i < warm + iters; ++i) {
      const auto start = Clock::now();
      if (me == 0) {
        accel::send(comm, std::span(buf), peer);
        accel::recv(comm, std::span(echo), peer);
      } else {
        accel::recv(comm, std::span(buf), peer);
        accel::send(comm, std::span(small), peer);
      }
      if (i >= warm) t.push_back(micros(Clock::now() - start));
    }
    if (me == 1 && buf[bytes - 1] != 1) {
      std::fprintf(stderr, "rank 1 received wrong data\n");
      return 1;
    }
    if (me == 0) {
      const double median = percentile(t, 0.5), mc = memcpy_median_us(bytes, std::min(iters, 50));
      std::printf("accel,bandwidth,%zu,%d,%.2f,%.2f,%.1f,%.2f,%.3f\n", bytes, iters, median, percentile(t, 0.9),
                  static_cast<double>(bytes) / median, mc, mc / median);
    }
  }
  std::fflush(stdout);
  accel::wait_for_everyone(state);
  return 0;
}
