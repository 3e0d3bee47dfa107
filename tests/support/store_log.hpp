// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// What the store tests share: bytes as text, and a StoreServer log that tests can search.
#pragma once

#include <accel/comm/store.hpp>

#include <chrono>
#include <cstddef>
#include <memory>
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

/// A job's store on loopback with a quiet log, and connections to it as any rank.
struct LocalStore {
  accel::StoreServer server{"127.0.0.1", 0, "job-token", quiet()};
  static accel::StoreServerOptions quiet() {
    accel::StoreServerOptions o;
    o.log = [](const std::string&) {};
    return o;
  }
  std::shared_ptr<accel::StoreClient> client(int rank, int world, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return std::make_shared<accel::StoreClient>("127.0.0.1", server.port(), "job-token", timeout, rank, world);
  }
};

}  // namespace accel_test
