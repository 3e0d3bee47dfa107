// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Cost of creating process groups: one rank of a CPU job that times grid_groups (a replicas x
// stages grid: one all_gather of the grid, then two splits, each one world round plus the setup
// round of every group) for each shape it is given, against one world barrier as a yardstick.
//
//   accel launch --cpu --num_processes N group_creation_bench [--shapes RxS,RxS,...] [--iters K]
//
// --shapes defaults to R x N/R for R = N, N/2, N/4, ... down to 1 where R divides N; --iters
// (default 10) timed creations per shape after 2 untimed ones. Each creation starts right after a
// world barrier (the warm-up collective that lines the ranks up); each rank times its own
// grid_groups call, and an iteration's time is its slowest rank's. Between iterations every rank destroys its groups
// (untimed). Rank 0 prints one CSV line per shape:
//   world,replicas,stages,iters,median_ms,p90_ms,barrier_median_ms,barrier_p90_ms
// where median and p90 (nearest rank) are over the iterations, and the barrier columns time a
// world barrier (wait_for_everyone) the same way, measured alongside.
//
// benchmarks/group_creation.sh runs it at 64 processes for 64x1 ... 1x64 and at 8, 16, 32, 64
// processes for a fixed 4 stages, the figures issue 31 asks for:
//   cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DACCEL_BUILD_BENCHMARKS=ON -DACCEL_BUILD_TESTS=OFF \
//         -DACCEL_WITH_CUDA=OFF -DACCEL_WITH_NCCL=OFF
//   cmake --build build/bench --target accel-cli accel_group_creation_bench
//   benchmarks/group_creation.sh build/bench            (ACCEL_CPU_SHM=0 in front: everything through the store)
#include <accel/comm/collectives.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  int replicas = 0, stages = 0;
};

// "64x1,32x2": the shapes; exits with a usage message on anything else.
std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const auto end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    const auto x = item.find('x');
    char* tail = nullptr;
    Shape s;
    if (x != std::string::npos) {
      s.replicas = static_cast<int>(std::strtol(item.c_str(), &tail, 10));
      if (tail == item.c_str() + x) s.stages = static_cast<int>(std::strtol(item.c_str() + x + 1, &tail, 10));
    }
    if (x == std::string::npos || s.replicas < 1 || s.stages < 1 || *tail != '\0') {
      std::fprintf(stderr, "group_creation_bench: --shapes takes RxS,RxS,... (e.g. 8x8), not '%s'\n", item.c_str());
      std::exit(2);
    }
    out.push_back(s);
    pos = end + 1;
  }
  return out;
}

// Median and p90 (nearest rank) of `v`.
std::pair<double, double> median_p90(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto p90 = static_cast<std::size_t>(std::max(0.0, 0.9 * static_cast<double>(v.size()) - 1e-9));
  return {v[v.size() / 2], v[std::min(v.size() - 1, p90)]};
}

double since_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The slowest rank's time of `step`, `iters` times after 2 untimed runs, each after a world barrier.
// What `step` returns is destroyed after the timing (the groups' teardown is not counted).
template <class Step>
std::vector<double> time_slowest(accel::DistributedState& state, int iters, Step&& step) {
  std::vector<double> out;
  for (int i = -2; i < iters; ++i) {
    accel::wait_for_everyone(state);
    const auto t0 = Clock::now();
    [[maybe_unused]] const auto kept = step();
    const double mine = since_ms(t0);
    const auto all = accel::gather_object(state, mine);
    if (i >= 0) out.push_back(*std::max_element(all.begin(), all.end()));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape> shapes;
  int iters = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--shapes" && i + 1 < argc) shapes = parse_shapes(argv[++i]);
    else if (arg == "--iters" && i + 1 < argc) iters = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "group_creation_bench: unknown argument '%s' (--shapes RxS,..., --iters K)\n", arg.c_str());
      return 2;
    }
  }
  try {
    accel::DistributedState state;
    const int world = state.num_processes();
    if (shapes.empty())
      for (int r = world; r >= 1; r /= 2)
        if (world % r == 0) shapes.push_back({r, world / r});
    if (state.is_main_process()) std::printf("world,replicas,stages,iters,median_ms,p90_ms,barrier_median_ms,barrier_p90_ms\n");
    for (const Shape& s : shapes) {
      const auto barrier = median_p90(time_slowest(state, iters, [&] { return (accel::wait_for_everyone(state), 0); }));
      const auto create = median_p90(time_slowest(state, iters, [&] { return accel::grid_groups(state, s.replicas, s.stages); }));
      if (state.is_main_process()) {
        std::printf("%d,%d,%d,%d,%.2f,%.2f,%.2f,%.2f\n", world, s.replicas, s.stages, iters, create.first, create.second, barrier.first,
                    barrier.second);
        std::fflush(stdout);
      }
    }
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "group_creation_bench: %s\n", e.what());
    return 1;
  }
}
