// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// libFuzzer harness for the store's frame parser and server state machine, and for the value
// decoders (raw, CBOR and the binary field encoding): any byte sequence must produce a reply or an
// error, never a crash, leak or hang.
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -I include tests/fuzz/store_frame_fuzz.cpp
// (tests/fuzz/CMakeLists.txt builds it with clang++; a short fixed-seed run is part of ctest.)
#include <accel/comm/store_core.hpp>
#include <accel/comm/serialize.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/cbor_reader.hpp"

namespace {
struct Item {
  int id = 0;
  std::string text;
  std::vector<double> scores;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Item, id, text, scores)

// The binary field encoding (fields.hpp): nested containers, optionals, bools, maps.
struct Declared {
  int id = 0;
  std::string text;
  std::vector<float> scores;
  std::optional<std::vector<std::string>> stops;
  std::map<std::string, std::pair<bool, std::int64_t>> extra;
};
ACCEL_DEFINE_FIELDS(Declared, id, text, scores, stops, extra)

// The field reader on its own, past the format byte and fingerprint check a random input rarely passes.
template <class T>
void read_fields(std::span<const std::byte> b) {
  const std::string type = "fuzzed";
  try {
    accel::detail::ByteSource src(b, 0, type);
    T v{};
    accel::detail::binary::get(src, v);
  } catch (const accel::serialization_error&) {
  }
}

template <class T>
void decode(std::span<const std::byte> b) {
  try {
    (void)accel::from_bytes<T>(b, 0);
  } catch (const accel::serialization_error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> all(reinterpret_cast<const std::byte*>(data), size);
  const auto flags = static_cast<std::uint8_t>(all[0]);
  const auto bytes = all.subspan(1);

  // 1. The request parser on its own.
  try {
    (void)accel::detail::parse_request(bytes);
  } catch (const accel::detail::wire_error&) {
  }

  // 2. The state machine: two connections, the first optionally past the handshake, input fed in
  //    chunks whose size the first byte picks, then timeouts and disconnects.
  accel::detail::StoreCoreOptions o;
  o.job_token = "token";
  o.max_frame_bytes = 1 << 16;
  o.max_handshake_bytes = 256;
  o.world_size = (flags >> 4) & 3;
  accel::detail::StoreCore core(o);
  auto now = accel::detail::StoreClock::now();
  core.open(1, "fuzz-1");
  core.open(2, "fuzz-2");
  if (flags & 1) {
    const auto hello = accel::detail::encode_hello("token", 0, 2);
    core.receive(1, hello, now);
  }
  if (flags & 2) {
    const auto hello = accel::detail::encode_hello("token", 1, 2);
    core.receive(2, hello, now);
  }
  const std::size_t chunk = 1 + (flags >> 2) % 7;
  for (std::size_t at = 0; at < bytes.size(); at += chunk) {
    const auto part = bytes.subspan(at, std::min(chunk, bytes.size() - at));
    core.receive((at / chunk) % 3 == 2 ? 2 : 1, part, now);
    core.resume(now);
  }
  now += std::chrono::hours(1);
  core.tick(now);
  core.resume(now);
  core.closed((flags & 64) ? 1 : 2, now);
  core.resume(now);
  core.closed((flags & 64) ? 2 : 1, now);

  // 3. The value decoder for each payload format.
  decode<int>(bytes);
  decode<std::string>(bytes);
  decode<std::vector<std::int32_t>>(bytes);
  decode<std::vector<std::string>>(bytes);
  decode<std::vector<Item>>(bytes);
  // accel's own CBOR item reader reads what nlohmann reads (support/cbor_reader.hpp).
  if (!bytes.empty()) {  // past the format byte, as in a payload
    const auto* cbor = reinterpret_cast<const std::uint8_t*>(bytes.data());
    const std::string verdict = accel_test::cbor_verdict(cbor + 1, cbor + bytes.size());
    if (verdict != "agrees" && verdict != "both refuse" && verdict != "documented difference") {
      std::fprintf(stderr, "CBOR reader differs from nlohmann: %s\n", verdict.c_str());
      std::abort();
    }
  }
  decode<std::vector<Declared>>(bytes);
  read_fields<std::vector<Declared>>(bytes);
  read_fields<std::map<int, std::vector<std::optional<std::string>>>>(bytes);
  return 0;
}

#ifdef ACCEL_FUZZ_STANDALONE
// Without libFuzzer (g++): replay the files named on the command line.
#include <fstream>
#include <iterator>
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(b.data()), b.size());
  }
  return 0;
}
#endif
