// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file blame.hpp
/// @brief Which rank accel launch blames when several fail: a pure decision over what the
/// supervisor saw (how and when each rank ended) and what the job's store saw (when each rank left
/// it). Used by detail/supervisor.hpp; tested with synthetic event orders in tests/launch/blame_test.cpp.
///
/// Why the store's view: when rank A fails, the store tells the others at once, and they fail too.
/// Such a consequence can end before A's own exit status is ready to reap (A's connection closes
/// early in its exit, or A spends a while in atexit handlers or driver teardown after leaving), so
/// the order in which processes end is not the order of cause. A consequence can only follow the
/// store's news of A, so the store sees A leave before the consequence leaves or ends.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include <accel/comm/store_core.hpp>
#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN
namespace launch::detail {

using SteadyTime = std::chrono::steady_clock::time_point;

/// @brief How long a rank that already left the job's store gets to end on its own once another
/// rank failed, before the launcher stops it (it may be the cause, still on its way out: its own
/// exit status then names the failure). Never more than the grace period.
inline constexpr std::chrono::milliseconds departed_settle{2000};

/// @brief The first time the store saw `rank` leave, if it did.
inline std::optional<RankDeparture> departure_of(std::span<const RankDeparture> departures, int rank) {
  std::optional<RankDeparture> first;
  for (const auto& d : departures)
    if (d.rank == rank && (!first || d.when < first->when)) first = d;
  return first;
}

/// @brief How one rank ended, as the supervisor saw it.
struct RankEnd {
  int rank = 0;
  bool failed = false;      ///< non-zero exit or killed by a signal
  bool on_its_own = true;   ///< ended before the launcher signalled it (so its status is its own)
  SteadyTime reaped{};      ///< when the supervisor collected its exit status
  std::optional<SteadyTime> left_store;  ///< when the job's store saw it leave, if it did
};

/// @brief The blamed rank and the ones that failed after it (indices into the ends given).
struct Blame {
  std::optional<std::size_t> culprit;     ///< none when no rank failed on its own
  std::vector<std::size_t> consequences;  ///< the other ranks that failed on their own, in the order they went
};

/// @brief Blames the rank that went first among those that failed on their own. A rank "went"
/// when the store saw it leave or when its exit status was collected, whichever came first; ties
/// go to the earlier end in `ends` (the supervisor's reaping order). Ranks the launcher stopped
/// (it signalled them first) are neither blamed nor counted as consequences.
/// @param ends every rank that ended, in the order the supervisor collected them
inline Blame blame_first_failure(std::span<const RankEnd> ends) {
  auto went = [](const RankEnd& e) { return e.left_store ? std::min(*e.left_store, e.reaped) : e.reaped; };
  std::vector<std::size_t> failed;
  for (std::size_t i = 0; i < ends.size(); ++i)
    if (ends[i].failed && ends[i].on_its_own) failed.push_back(i);
  std::stable_sort(failed.begin(), failed.end(), [&](std::size_t a, std::size_t b) { return went(ends[a]) < went(ends[b]); });
  Blame blame;
  if (failed.empty()) return blame;
  blame.culprit = failed.front();
  blame.consequences.assign(failed.begin() + 1, failed.end());
  return blame;
}

}  // namespace launch::detail
ACCEL_NAMESPACE_END
