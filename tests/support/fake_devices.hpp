// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file fake_devices.hpp
/// @brief Fake device queries for tests: N GPUs of some size, or "insufficient driver".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <accel/runtime/devices.hpp>

namespace accel_test {

inline constexpr std::uint64_t operator""_GiB(unsigned long long v) { return v << 30; }

/// @brief Records what the state asked of the fake.
struct FakeDeviceLog {
  std::vector<int> made_current;
  int list_calls = 0;
};

/// @brief A query reporting `n` GPUs named "Fake GPU" with `total` bytes each (free = total - 1 GiB).
inline accel::DeviceQuery fake_gpus(int n, std::uint64_t total = 80_GiB, std::shared_ptr<FakeDeviceLog> log = nullptr) {
  return {[n, total, log](bool) {
            if (log) ++log->list_calls;
            accel::DeviceList out;
            out.driver = "13.0";
            for (int i = 0; i < n; ++i)
              out.gpus.push_back({i, "Fake GPU", total, total - (1ull << 30),
                                  "GPU-0000000" + std::to_string(i) + "-aaaa-bbbb-cccc-dddddddddddd"});
            if (n == 0) out.status = "no CUDA device";
            return out;
          },
          [log](int i) {
            if (log) log->made_current.push_back(i);
          }};
}

/// @brief What a machine without a driver reports (CUDA compiled in, cudaErrorInsufficientDriver).
inline accel::DeviceQuery no_driver() { return accel::cpu_only_device_query("insufficient driver"); }

}  // namespace accel_test
