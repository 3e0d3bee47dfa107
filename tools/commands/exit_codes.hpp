// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Exit codes of the accel command, one per error category (documented in docs/exit-codes.md).
#pragma once

#include <string>

#include <accel/runtime/error.hpp>

namespace accel_cli {

inline constexpr int exit_usage = 2;        ///< bad command line (usage_error)
inline constexpr int exit_config = 3;       ///< bad environment / configuration (config_error)
inline constexpr int exit_unavailable = 4;  ///< feature not compiled in, no usable GPU
inline constexpr int exit_planning = 5;     ///< infeasible device map
inline constexpr int exit_checkpoint = 6;   ///< malformed checkpoint
inline constexpr int exit_comm = 7;         ///< communication failure or timeout
inline constexpr int exit_launch = 8;       ///< launcher could not start its children
inline constexpr int exit_device = 9;       ///< a CUDA call failed (out of device memory, driver error)
inline constexpr int exit_internal = 70;    ///< anything else (a bug: please report it)

/// @brief Maps an accel::error to the command's exit code by its category.
inline int exit_code_for(const accel::error& e) {
  const std::string& c = e.category();
  if (c == "usage") return exit_usage;
  if (c == "config") return exit_config;
  if (c == "unavailable") return exit_unavailable;
  if (c == "planning") return exit_planning;
  if (c == "checkpoint") return exit_checkpoint;
  if (c == "comm" || c == "comm.timeout" || c == "nccl") return exit_comm;
  if (c == "launch") return exit_launch;
  if (c == "cuda") return exit_device;
  return exit_internal;
}

}  // namespace accel_cli
