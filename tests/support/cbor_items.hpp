// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The invariant of accel's own CBOR item reader (comm/detail/cbor_items.hpp): on any bytes that
// open an array, it reads exactly the items nlohmann::json::from_cbor reads, or both refuse.
// Documented differences, where accel refuses what nlohmann reads: containers nested more than
// cbor_max_depth deep, and indefinite-length strings whose chunks are themselves indefinite
// (RFC 8949 §3.2.3 forbids them; nlohmann recurses into them without a bound).
// Checked by a unit test over mutated encodings and by the store_frame fuzz harness.
#pragma once

#include <accel/comm/detail/cbor_items.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace accel_test {

/// "agrees", "both refuse", "documented difference", or what differs.
inline std::string cbor_items_verdict(const std::uint8_t* first, const std::uint8_t* last) {
  if (first == last || (*first >> 5) != 4) return "not an array";
  std::optional<nlohmann::json> theirs;
  try {
    theirs = nlohmann::json::from_cbor(first, last);
  } catch (const nlohmann::json::exception&) {
  }
  auto ours = nlohmann::json::array();
  std::string refusal;
  try {
    accel::detail::read_cbor_items(first, last, [&](const nlohmann::json& item) { ours.push_back(item); });
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  if (!theirs && !refusal.empty()) return "both refuse";
  if (theirs && !refusal.empty()) {
    if (refusal.find("nested more than") != std::string::npos || refusal.find("chunk of another type") != std::string::npos)
      return "documented difference";
    return "accel refuses what nlohmann reads: " + refusal;
  }
  if (!theirs) return "accel reads what nlohmann refuses: " + ours.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // As text: NaN and signed/unsigned integers compare the way both builders agree on them.
  auto text = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  if (text(*theirs) != text(ours)) return "different values: " + text(*theirs) + " vs " + text(ours);
  return "agrees";
}

}  // namespace accel_test
