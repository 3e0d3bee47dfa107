// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// parallel_for, the loop the loader's host copy and the reading of a checkpoint's headers run on
// several threads.
#include <accel/runtime/parallel_for.hpp>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/catch.hpp"

using accel::copy_threads;
using accel::parallel_for;

TEST_CASE("parallel_for runs every item once and reports all bytes on the calling thread only", "[parallel_for]") {
  const unsigned threads = GENERATE(1u, 2u, 5u);
  std::vector<std::atomic<int>> runs(1000);
  std::vector<int> by_worker(threads);
  const auto caller = std::this_thread::get_id();
  std::uint64_t reported = 0;
  bool foreign_report = false;
  parallel_for(
      runs.size(), threads,
      [&](std::size_t i, unsigned worker) {
        runs[i].fetch_add(1);
        ++by_worker[worker];  // one worker's calls are sequential: no lock needed
        return std::uint64_t{i + 1};
      },
      [&](std::uint64_t n) {
        foreign_report = foreign_report || std::this_thread::get_id() != caller;
        reported += n;
      });
  for (const auto& r : runs) REQUIRE(r.load() == 1);
  REQUIRE(reported == 1000u * 1001u / 2u);
  REQUIRE_FALSE(foreign_report);
  int total = 0;
  for (int n : by_worker) total += n;
  REQUIRE(total == 1000);
}

TEST_CASE("parallel_for rethrows a failure once every thread stopped, starting no item after it on one thread",
          "[parallel_for]") {
  const unsigned threads = GENERATE(1u, 3u);
  std::atomic<int> started{0};
  REQUIRE_THROWS_WITH(parallel_for(
                          10000, threads,
                          [&](std::size_t i, unsigned) -> std::uint64_t {
                            ++started;
                            if (i == 5) throw std::runtime_error("item 5 failed");
                            return 1;
                          },
                          [](std::uint64_t) {}),
                      "item 5 failed");
  if (threads == 1) REQUIRE(started.load() == 6);  // nothing after the failing item was started
}

TEST_CASE("a progress report that throws stops the other threads and reaches the caller", "[parallel_for]") {
  std::atomic<int> started{0};
  REQUIRE_THROWS_WITH(parallel_for(
                          100000, 2,
                          [&](std::size_t, unsigned) -> std::uint64_t {
                            ++started;
                            return 1;
                          },
                          [](std::uint64_t) { throw std::runtime_error("cancelled by the callback"); }),
                      "cancelled by the callback");
}

TEST_CASE("copy_threads: the wanted count, one per core (at most 8) for 0, never more than the items", "[parallel_for]") {
  REQUIRE(copy_threads(3, 100) == 3);
  REQUIRE(copy_threads(3, 2) == 2);
  REQUIRE(copy_threads(3, 0) == 1);
  const unsigned cores = std::max(std::thread::hardware_concurrency(), 1u);
  REQUIRE(copy_threads(0, 1000) == std::min(cores, 8u));
}
