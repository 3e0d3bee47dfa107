// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for the HF device-map JSON: any text either parses into a map that prints and
// re-parses to the same keys and placements, in order, with every key covering itself, or throws
// accel::config_error; nothing else.
#include <accel/plan/device_map.hpp>

#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto map = accel::DeviceMap::from_json(text);
    const auto again = accel::DeviceMap::from_json(map.to_json_string());
    accel_fuzz::check(again.entries() == map.entries());
    for (const auto& [key, placement] : map) {
      const auto* c = map.covering(key);
      accel_fuzz::check(c != nullptr && c->first == key && c->second == placement);
    }
  } catch (const accel::config_error&) {
  }
  return 0;
}
