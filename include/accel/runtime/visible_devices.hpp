// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file visible_devices.hpp
/// @brief CUDA_VISIBLE_DEVICES parsed as the driver reads it (a pure function).
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN
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
