// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file fake_env.hpp
/// @brief Environment maps of each launcher convention, for tests.
#pragma once

#include <map>
#include <string>

#include <accel/runtime/env.hpp>

namespace accel_test {

using Vars = std::map<std::string, std::string>;

/// @brief What torchrun gives worker `rank` of `world` with `local` workers per machine.
inline Vars torchrun_vars(int rank, int world, int local) {
  return {{"RANK", std::to_string(rank)},           {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank % local)}, {"LOCAL_WORLD_SIZE", std::to_string(local)},
          {"GROUP_RANK", std::to_string(rank / local)}, {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29511"}};
}

inline Vars with(Vars v, const Vars& extra) {
  for (const auto& [k, val] : extra) v[k] = val;
  return v;
}

inline accel::LaunchEnv read(const Vars& v) { return accel::read_launch_env(accel::map_env(v)); }

}  // namespace accel_test
