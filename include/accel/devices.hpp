// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file devices.hpp
/// @brief Devices (`cuda:1`, `cpu`), the device-query seam, and CUDA_VISIBLE_DEVICES parsing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "config.hpp"
#include "error.hpp"

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

/// @brief CUDA_VISIBLE_DEVICES as the driver will read it.
struct VisibleDevices {
  bool set = false;                      ///< the variable is present (possibly empty)
  std::vector<std::string> ids;          ///< effective entries in order: indices ("5") or UUIDs ("GPU-…", "MIG-…")
  std::vector<std::string> diagnostics;  ///< one sentence per problem found, empty when clean
  bool duplicated = false;               ///< an entry repeats: the driver then exposes no GPU at all
  bool truncated = false;                ///< an invalid entry cut the list short
  bool uses_uuids = false;               ///< entries are GPU-/MIG- identifiers

  /// @brief The physical identifier behind a logical index: `ids[i]` when set, else `i` itself.
  [[nodiscard]] std::string physical(int logical) const {
    if (!set) return std::to_string(logical);
    return logical >= 0 && static_cast<std::size_t>(logical) < ids.size() ? ids[static_cast<std::size_t>(logical)] : "?";
  }
};

/// @brief Parses a CUDA_VISIBLE_DEVICES value like the driver does (pure function).
///
/// In: `"2,5"` → ids {2, 5}; `""` → no GPU; `"0,2,-1,1"` → {0, 2} (an invalid entry ends the list);
/// `"1,1"` → no GPU (duplicates expose nothing); `" 3"` → {3} with a whitespace diagnostic.
/// @param value the variable's value, or std::nullopt when unset
inline VisibleDevices parse_visible_devices(std::optional<std::string_view> value) {
  VisibleDevices out;
  if (!value) return out;
  out.set = true;
  const std::string_view text = *value;
  if (text.find_first_not_of(" \t") == std::string_view::npos) {
    out.diagnostics.push_back(text.empty() ? "CUDA_VISIBLE_DEVICES is set to the empty string: no GPU is visible (unset it to see all GPUs)"
                                           : "CUDA_VISIBLE_DEVICES holds only whitespace: no GPU is visible (unset it to see all GPUs)");
    return out;
  }
  auto trim = [](std::string_view s) {
    const auto b = s.find_first_not_of(" \t");
    const auto e = s.find_last_not_of(" \t");
    return b == std::string_view::npos ? std::string_view{} : s.substr(b, e - b + 1);
  };
  auto is_uuid = [](std::string_view s) { return s.starts_with("GPU-") || s.starts_with("MIG-"); };
  std::size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    const auto comma = text.find(',', pos);
    const std::string_view raw = text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? text.size() + 1 : comma + 1;
    const std::string_view entry = trim(raw);
    if (entry.size() != raw.size())
      out.diagnostics.push_back(detail::concat("entry '", raw, "' has whitespace around it; write '", entry, "'"));
    auto stop = [&](const std::string& why) {
      out.truncated = true;
      out.diagnostics.push_back(detail::concat("entry '", entry, "' ", why,
                                               ": the driver ignores it and every entry after it"));
    };
    if (first) out.uses_uuids = is_uuid(entry);
    first = false;
    if (out.uses_uuids) {
      if (!is_uuid(entry) || entry.size() == 4) {
        stop("is not a GPU-/MIG- identifier in a list of identifiers");
        break;
      }
      out.ids.emplace_back(entry);
      continue;
    }
    std::size_t digits = 0;
    while (digits < entry.size() && entry[digits] >= '0' && entry[digits] <= '9') ++digits;
    if (digits == 0) {
      stop(entry.starts_with("-") ? "is negative" : "is not a GPU index");
      break;
    }
    if (digits != entry.size())
      out.diagnostics.push_back(detail::concat("entry '", entry, "' is read as '", entry.substr(0, digits),
                                               "' (the driver stops at the first non-digit)"));
    std::string id(entry.substr(0, digits));
    id.erase(0, std::min(id.find_first_not_of('0'), id.size() - 1));  // "05" names GPU 5
    out.ids.push_back(std::move(id));
  }
  for (std::size_t i = 0; i < out.ids.size() && !out.duplicated; ++i)
    for (std::size_t j = i + 1; j < out.ids.size(); ++j)
      if (out.ids[i] == out.ids[j]) {
        out.duplicated = true;
        out.diagnostics.push_back(detail::concat("GPU '", out.ids[i], "' is listed twice in CUDA_VISIBLE_DEVICES='", text,
                                                 "': with a duplicate the driver exposes no GPU at all; list each GPU once"));
        break;
      }
  if (out.duplicated) out.ids.clear();
  return out;
}

ACCEL_NAMESPACE_END

#include "detail/cuda_devices.hpp"

ACCEL_NAMESPACE_BEGIN
/// @brief The real device query: the CUDA runtime when compiled in, else no GPUs.
inline DeviceQuery default_device_query() {
#if ACCEL_HAS_CUDA()
  return detail::cuda_device_query();
#else
  return cpu_only_device_query();
#endif
}

/// @brief Number of GPUs this process sees (0 with no driver, no device, or a CPU-only build).
inline int visible_gpu_count() { return static_cast<int>(default_device_query().list(false).gpus.size()); }
ACCEL_NAMESPACE_END
