// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for the safetensors header parser: any byte sequence either parses into a
// header that satisfies every format invariant or throws accel::checkpoint_error; nothing else
// (crash, other exception, sanitizer report) is allowed. Also feeds the bytes to the index and
// offload-index parsers, which must behave the same way. The DOM-free fast paths for headers and
// indexes must decline or read what the strict parser reads (support/plain_json.hpp).
#include <accel/load/offload.hpp>
#include <accel/model/safetensors.hpp>

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "support/plain_json.hpp"

namespace {
void check(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto h = accel::parse_safetensors_header(bytes, size, "fuzz");
    check(h.data_offset == 8 + h.header_size && h.file_size == size);
    std::uint64_t expected = 0;
    for (const auto& t : h.tensors) {
      check(t.begin == expected && t.end >= t.begin);
      check(accel::tensor_bytes(t.dtype, t.numel()) == t.size_bytes());
      check(h.find(t.name) == &t);
      expected = t.end;
    }
    check(h.data_offset + expected == size);
  } catch (const accel::checkpoint_error&) {
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto header = accel_test::plain_header_verdict(size >= 8 ? text.substr(8) : text);
  check(header == "declined" || header == "agrees");
  const auto index = accel_test::plain_index_verdict(text);
  check(index == "declined" || index == "agrees");
  try {
    (void)accel::parse_safetensors_index(text, "fuzz");
  } catch (const accel::checkpoint_error&) {
  }
  try {
    (void)accel::parse_offload_index(text, "fuzz");
  } catch (const accel::checkpoint_error&) {
  }
  return 0;
}
