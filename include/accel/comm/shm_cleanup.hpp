// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file shm_cleanup.hpp
/// @brief Removing the shared-memory segments a job's processes left behind.
///
/// The CPU communicator's segments (`/dev/shm/accel.<pid namespace>.<pid>.<n>.{a,b}`) are unlinked
/// when the communicator ends; a process killed before that (SIGKILL, or the SIGTERM a launcher
/// sends the rest of a failed job) leaves them. `accel launch` calls remove_shm_segments_of() with
/// its ranks' pids when the job has ended.
/// @code
///   std::vector<int> pids = {4711, 4712};  // the job's processes, all ended
///   std::size_t n = accel::remove_shm_segments_of(pids);
/// @endcode
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <span>

#include <accel/runtime/config.hpp>
#include <accel/comm/detail/shm.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Unlinks the shared-memory segments created by the processes `pids` (of this user and PID
/// namespace) that no longer exist; segments of a pid that is alive again (reused) are kept.
/// @param dir where the segments are listed (the tmpfs behind shm_open)
/// @return how many segments were removed
inline std::size_t remove_shm_segments_of(std::span<const pid_t> pids, const char* dir = "/dev/shm") noexcept {
  return detail::remove_shm_segments_if(
      [&](pid_t pid) { return std::find(pids.begin(), pids.end(), pid) != pids.end() && detail::pid_unused(pid); }, dir);
}

ACCEL_NAMESPACE_END
