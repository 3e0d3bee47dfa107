// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// What the store tests share: bytes as text, and a StoreServer log that tests can search.
#pragma once

#include <accel/comm/cpu.hpp>
#include <accel/comm/store.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <future>
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
  LocalStore() = default;
  /// A store with these options (its log is replaced by a quiet one).
  explicit LocalStore(accel::StoreServerOptions o) : server("127.0.0.1", 0, "job-token", (o.log = quiet().log, std::move(o))) {}
  accel::StoreServer server{"127.0.0.1", 0, "job-token", quiet()};
  static accel::StoreServerOptions quiet() {
    accel::StoreServerOptions o;
    o.log = [](const std::string&) {};
    return o;
  }
  std::shared_ptr<accel::StoreClient> client(int rank, int world, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return std::make_shared<accel::StoreClient>("127.0.0.1", server.port(), "job-token", timeout, rank, world);
  }
  /// Runs fn(comm) for `n` CPU-backend ranks, each on its own thread with its own connection;
  /// returns each rank's exception message ("" for none).
  std::vector<std::string> run_cpu(int n, const accel::CpuCommOptions& options, const std::function<void(accel::CpuCommunicator&)>& fn,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::vector<std::future<std::string>> fs;
    for (int r = 0; r < n; ++r)
      fs.push_back(std::async(std::launch::async, [&, r] {
        try {
          accel::CpuCommunicator comm(client(r, n, timeout), r, n, options);
          fn(comm);
          return std::string();
        } catch (const std::exception& e) {
          return std::string(e.what());
        }
      }));
    std::vector<std::string> out;
    for (auto& f : fs) out.push_back(f.get());
    return out;
  }
};

}  // namespace accel_test
