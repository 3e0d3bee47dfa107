// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file parallel_for.hpp
/// @brief Runs independent work items on a few threads (the caller's thread is
///        one of them), with progress reported on the caller's thread and the first failure
///        rethrown there once every thread has stopped.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief How many threads a parallel host copy uses: `wanted`, or for 0 one per core (at most
///        8: two or three already saturate memory bandwidth on common machines); never more than
///        `items` and never less than 1.
[[nodiscard]] inline unsigned copy_threads(unsigned wanted, std::size_t items) noexcept {
  unsigned n = wanted ? wanted : std::min(std::max(std::thread::hardware_concurrency(), 1u), 8u);
  if (items < n) n = static_cast<unsigned>(std::max<std::size_t>(items, 1));
  return n;
}

/// @brief Calls `work(i, worker)` for every i in [0, count) on `threads` threads (worker 0 is the
///        calling thread; each worker's calls are sequential, so per-worker scratch needs no lock).
///        `work` returns the bytes it consumed; `report(n)` is called on the calling thread only,
///        with the bytes finished since its last call, after each item the caller finishes and
///        once at the end, so a progress callback never runs on another thread.
/// @throws the first exception any `work` call threw, after all threads stopped (items not yet
///         started are skipped once one has failed)
template <class Work, class Report>
void parallel_for(std::size_t count, unsigned threads, Work&& work, Report&& report) {
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex first_mutex;
  auto run = [&](unsigned worker) {
    for (std::size_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < count;) {
      try {
        done.fetch_add(work(i, worker), std::memory_order_relaxed);
        if (worker == 0)
          if (const std::uint64_t n = done.exchange(0, std::memory_order_relaxed)) report(n);
      } catch (...) {
        std::lock_guard lock(first_mutex);
        if (!first) first = std::current_exception();
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (unsigned w = 1; w < threads; ++w) pool.emplace_back(run, w);
  } catch (...) {  // no thread for this one (the system's limit): stop the others, report that
    failed.store(true);
    for (auto& t : pool) t.join();
    throw;
  }
  run(0);
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
  if (const std::uint64_t n = done.exchange(0)) report(n);
}

ACCEL_NAMESPACE_END
