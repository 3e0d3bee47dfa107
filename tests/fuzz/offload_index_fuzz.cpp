// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for an offload folder's index.json (and its journal lines, which are the same
// format): any text either parses into entries that survive a write/read round trip unchanged,
// or throws accel::checkpoint_error; nothing else. Every name is also checked against the
// offload file-name rule: offload_file throws exactly when offload_name_problem names a problem.
#include <accel/load/offload.hpp>

#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  accel::OffloadIndex index;
  try {
    index = accel::parse_offload_index(text, "fuzz");
  } catch (const accel::checkpoint_error&) {
    return 0;
  }
  const auto again = accel::parse_offload_index(accel::offload_index_json(index), "round trip");
  accel_fuzz::check(again.size() == index.size());
  for (const auto& [name, e] : index) {
    const auto& r = again.at(name);
    accel_fuzz::check(r.dtype == e.dtype && r.shape == e.shape && r.source == e.source &&
                      r.safetensors_file == e.safetensors_file && r.weight_name == e.weight_name);
    accel_fuzz::check(accel::tensor_bytes(e.dtype, e.numel()).has_value() || !e.safetensors_file.empty());
    bool threw = false;
    try {
      (void)accel::offload_file("/folder", name);
    } catch (const accel::usage_error&) {
      threw = true;
    }
    accel_fuzz::check(threw == accel::offload_name_problem(name).has_value());
  }
  return 0;
}
