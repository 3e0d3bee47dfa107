// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file device.hpp
/// @brief Devices (`cuda:1`, `cpu`) and the device-query seam (what GPUs exist, which one is current).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief A compute device as a process sees it: `cpu`, or `cuda:<logical index>`.
class Device {
 public:
  enum class Kind { cpu, cuda };
  /// @brief The host CPU.
  static constexpr Device cpu() noexcept { return Device(Kind::cpu, -1); }
  /// @brief The CUDA device with this logical index (after CUDA_VISIBLE_DEVICES renumbering).
  static constexpr Device cuda(int index) noexcept { return Device(Kind::cuda, index); }
  constexpr Device() noexcept = default;

  [[nodiscard]] constexpr Kind kind() const noexcept { return kind_; }
  [[nodiscard]] constexpr bool is_cuda() const noexcept { return kind_ == Kind::cuda; }
  [[nodiscard]] constexpr bool is_cpu() const noexcept { return kind_ == Kind::cpu; }
  /// @brief The logical CUDA index; -1 for the CPU.
  [[nodiscard]] constexpr int index() const noexcept { return index_; }
  /// @brief `cpu` or `cuda:<index>`.
  [[nodiscard]] std::string to_string() const { return is_cuda() ? "cuda:" + std::to_string(index_) : "cpu"; }
  friend constexpr bool operator==(const Device&, const Device&) noexcept = default;
  friend std::ostream& operator<<(std::ostream& out, const Device& d) { return out << d.to_string(); }

 private:
  constexpr Device(Kind kind, int index) noexcept : kind_(kind), index_(index) {}
  Kind kind_ = Kind::cpu;
  int index_ = -1;
};

/// @brief What the device query knows about one visible GPU (logical index order).
struct DeviceInfo {
  int index = 0;                 ///< logical index (0 .. count-1)
  std::string name;              ///< e.g. "NVIDIA H200"
  std::uint64_t total_memory = 0;
  std::uint64_t free_memory = 0; ///< 0 when not queried
  std::string uuid;              ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", or "" when unknown
};

/// @brief Result of enumerating GPUs. No driver or no device is data (zero GPUs), not an error.
struct DeviceList {
  std::vector<DeviceInfo> gpus;
  /// @brief Why there are no GPUs when `gpus` is empty: "", "no CUDA device", "insufficient driver",
  /// "CUDA not compiled in", or another runtime message.
  std::string status;
  std::string driver;  ///< driver version as "13.0", or "" when there is no driver
};

/// @brief The device seam: how accel enumerates GPUs and makes one current.
/// Tests inject fakes; `default_device_query()` is backed by the CUDA runtime when compiled in.
struct DeviceQuery {
  /// @brief Enumerates the visible GPUs; `with_free_memory` also asks each for its free memory
  /// (which creates a CUDA context on each, so the state never asks for it).
  std::function<DeviceList(bool with_free_memory)> list;
  /// @brief Makes the logical GPU current for the calling thread (cudaSetDevice).
  std::function<void(int)> make_current;
};

/// @brief A query that reports no GPU (the CPU-only build's default, and `cpu=true`).
inline DeviceQuery cpu_only_device_query(std::string status = "CUDA not compiled in") {
  return {[status](bool) { return DeviceList{{}, status, ""}; }, [](int) {}};
}

ACCEL_NAMESPACE_END
