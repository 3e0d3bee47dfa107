// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for budget strings: `--max-memory` (KEY=SIZE lists and JSON objects) and the
// single sizes of `--staging` / `--simulate-gpus`. Any text either parses into whole byte counts
// or throws accel::config_error; nothing else (no float-to-integer overflow, no recursion).
#include <accel/plan/max_memory.hpp>

#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = accel::parse_max_memory(text);
    accel_fuzz::check(!m.empty());
    (void)m.to_string();
  } catch (const accel::config_error&) {
  }
  try {
    (void)accel::parse_byte_size(text);
  } catch (const accel::config_error&) {
  }
  return 0;
}
