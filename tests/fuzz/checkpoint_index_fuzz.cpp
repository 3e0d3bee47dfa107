// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for model.safetensors.index.json: any text either parses into an index whose
// every tensor names a listed, safe shard, or throws accel::checkpoint_error; nothing else. The
// DOM-free fast paths (the index and resolve_checkpoint's summary of it) decline or read what
// the strict parser reads.
#include <accel/model/safetensors.hpp>

#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"
#include "support/plain_json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto verdict = accel_test::plain_index_verdict(text);
  accel_fuzz::check(verdict == "declined" || verdict == "agrees");
  const auto summary = accel_test::index_summary_verdict(text);
  accel_fuzz::check(summary == "declined" || summary == "agrees");
  try {
    const auto idx = accel::parse_safetensors_index(text, "fuzz");
    accel_fuzz::check(!idx.weight_map.empty() && !idx.shard_names.empty());
    for (const auto& [tensor, shard] : idx.weight_map) accel_fuzz::check(shard < idx.shard_names.size());
    for (const auto& name : idx.shard_names) {
      const std::filesystem::path p(name);
      accel_fuzz::check(!name.empty() && !p.is_absolute());
      for (const auto& part : p) accel_fuzz::check(part != "..");
    }
  } catch (const accel::checkpoint_error&) {
  }
  return 0;
}
