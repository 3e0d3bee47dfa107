// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file strict_json.hpp
/// @brief JSON parsing that rejects duplicate object keys (nlohmann keeps the last silently).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config.hpp"

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief Outcome of parse_json_strict: the value, or what went wrong.
struct StrictJsonResult {
  nlohmann::json value;
  std::string error;  ///< empty on success; else nlohmann's message or "duplicate key 'k'"
};

/// @brief Parses `text` as JSON, rejecting invalid UTF-8, trailing garbage and duplicate keys in
///        any object.
inline StrictJsonResult parse_json_strict(std::string_view text) {
  StrictJsonResult out;
  std::vector<std::unordered_set<std::string>> open;
  std::optional<std::string> duplicate;
  auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open.emplace_back();
    } else if (event == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == E::key && !open.empty() && !duplicate) {
      auto key = parsed.get<std::string>();
      if (!open.back().insert(key).second) duplicate = std::move(key);
    }
    return true;
  };
  try {
    out.value = nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    out.error = e.what();
    return out;
  }
  if (duplicate) out.error = "duplicate key '" + *duplicate + "'";
  return out;
}

}  // namespace detail
ACCEL_NAMESPACE_END
