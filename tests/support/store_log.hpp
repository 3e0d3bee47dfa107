// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// What the store tests share: bytes as text, and a StoreServer log that tests can search.
#pragma once

#include <accel/comm/store.hpp>

#include <cstddef>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace accel_test {

inline std::string text(std::span<const std::byte> b) { return {reinterpret_cast<const char*>(b.data()), b.size()}; }

/// Captures a StoreServer's log lines.
struct StoreLog {
  std::mutex m;
  std::vector<std::string> lines;
  /// Server options with this log attached.
  accel::StoreServerOptions options(int world = 0) {
    accel::StoreServerOptions o;
    o.world_size = world;
    o.log = [this](const std::string& s) {
      std::lock_guard lock(m);
      lines.push_back(s);
    };
    return o;
  }
  /// Whether some line contains `needle`.
  bool has(const std::string& needle) {
    std::lock_guard lock(m);
    for (const auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

}  // namespace accel_test
