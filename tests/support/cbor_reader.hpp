// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The invariant of accel's own CBOR reader (comm/detail/cbor.hpp): on any bytes, it reads exactly
// the value nlohmann::json::from_cbor reads, or both refuse; read item by item, an array gives
// the same items. Documented differences, where accel refuses what nlohmann reads: containers
// nested more than cbor_max_depth deep, and indefinite-length strings whose chunks are themselves
// indefinite (RFC 8949 §3.2.3 forbids them; nlohmann recurses into them without a bound).
// Checked by a unit test over mutated encodings and by the store_frame fuzz harness.
#pragma once

#include <accel/comm/serialize.hpp>  // its reader and writer live in comm/detail/cbor.hpp

#include <cstdint>
#include <exception>
#include <optional>
#include <string>

namespace accel_test {

/// "agrees", "both refuse", "documented difference", or what differs.
inline std::string cbor_verdict(const std::uint8_t* first, const std::uint8_t* last) {
  auto text = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  std::optional<nlohmann::json> theirs;
  try {
    theirs = nlohmann::json::from_cbor(first, last);
  } catch (const nlohmann::json::exception&) {
  }
  // Ours, read whole and (for an array) item by item: both must say the same.
  std::optional<nlohmann::json> whole, items;
  std::string refusal;
  try {
    whole = accel::detail::read_cbor(first, last);
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  if (first != last && (*first >> 5) == 4) {
    try {
      auto all = nlohmann::json::array();
      accel::detail::read_cbor_items(first, last, [&](const nlohmann::json& item) { all.push_back(item); });
      items = std::move(all);
    } catch (const std::exception&) {
    }
    if (whole.has_value() != items.has_value() || (whole && text(*whole) != text(*items)))
      return "item by item differs from whole: " + (items ? text(*items) : std::string("refused"));
  }
  if (!theirs && !whole) return "both refuse";
  if (theirs && !whole) {
    if (refusal.find("nested more than") != std::string::npos || refusal.find("chunk of another type") != std::string::npos)
      return "documented difference";
    return "accel refuses what nlohmann reads: " + refusal;
  }
  if (!theirs) return "accel reads what nlohmann refuses: " + text(*whole);
  // As text: NaN and signed/unsigned integers compare the way both builders agree on them.
  if (text(*theirs) != text(*whole)) return "different values: " + text(*theirs) + " vs " + text(*whole);
  return "agrees";
}

}  // namespace accel_test
