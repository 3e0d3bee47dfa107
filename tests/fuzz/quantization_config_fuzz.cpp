// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for quantization_config and the tensors it describes: the input is config.json
// text whose "__tensors" key lists [name, safetensors dtype, shape] (what a checkpoint's headers
// give; entries a header could not hold are skipped). Any input either classifies every tensor
// (stored bytes adding up, at least one quantized weight, elements no fewer than the stored weights
// could hold) or throws accel::checkpoint_error; nothing else.
#include <accel/model/architecture.hpp>
#include <accel/model/quantization.hpp>

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto config = accel::parse_model_config(text, "fuzz");
    auto parsed = accel::parse_quantization_config(config.json);
    if (!parsed) return 0;
    std::vector<accel::TensorEntry> entries;
    std::deque<std::string> names;  // what the entries' names view
    if (auto list = config.json.find("__tensors"); list != config.json.end() && list->is_array())
      for (const auto& t : *list) {
        if (!t.is_array() || t.size() != 3 || !t[0].is_string() || !t[1].is_string() || !t[2].is_array()) continue;
        const auto dtype = accel::detail::safetensors_dtype(t[1].get<std::string>());
        if (!dtype) continue;
        accel::TensorEntry e{names.emplace_back(t[0].get<std::string>()), *dtype, {}, 0, 0};
        bool ok = true;
        for (const auto& d : t[2]) {
          if (!d.is_number_integer() || d.get<std::int64_t>() < 0 || d.get<std::int64_t>() > (1 << 20)) ok = false;
          else e.shape.push_back(d.get<std::int64_t>());
        }
        if (!ok || e.shape.size() > 4) continue;
        e.end = accel::shape_numel(e.shape) * accel::bit_size(*dtype) / 8;
        entries.push_back(std::move(e));
      }
    std::vector<const accel::TensorEntry*> tensors;
    for (const auto& e : entries) tensors.push_back(&e);
    const auto q = accel::classify_quantized_tensors(*parsed, tensors);
    accel_fuzz::check(q.stored.size() == entries.size());
    accel_fuzz::check(entries.empty() || q.modules > 0);
    std::uint64_t stored = 0;
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (q.stored[i]) stored += entries[i].size_bytes();
    accel_fuzz::check(stored == q.stored_bytes);
    (void)accel::quantization_summary(q, accel::DType::BF16);
  } catch (const accel::checkpoint_error&) {
  }
  return 0;
}
