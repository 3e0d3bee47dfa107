// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// ACCEL_DEFINE_FIELDS: the binary field encoding, its shape check, and malformed input rejected.
#include <accel/comm/serialize.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "support/catch.hpp"

namespace demo {
enum class Stop : std::uint8_t { length, eos, stop_word };

struct Completion {
  int id = 0;
  double score = 0;
  std::string text;
  std::vector<int> tokens;
  friend bool operator==(const Completion&, const Completion&) = default;
};
ACCEL_DEFINE_FIELDS(Completion, id, score, text, tokens)

struct Span {
  std::int64_t begin = 0, end = 0;
  friend bool operator==(const Span&, const Span&) = default;
};

struct Rich {
  std::vector<Completion> beams;
  std::optional<std::string> error;
  std::map<std::string, std::vector<float>> logits;
  std::unordered_map<int, std::string> names;
  std::pair<bool, Stop> stop{false, Stop::length};
  std::tuple<std::uint16_t, std::string, std::optional<Span>> misc;
  std::array<Span, 2> spans{};
  std::vector<Span> more_spans;
  bool cached = false;
  friend bool operator==(const Rich&, const Rich&) = default;
};
ACCEL_DEFINE_FIELDS(Rich, beams, error, logits, names, stop, misc, spans, more_spans, cached)

// Same members as Completion under other names: another shape.
struct Renamed {
  int id = 0;
  double score = 0;
  std::string body;
  std::vector<int> tokens;
};
ACCEL_DEFINE_FIELDS(Renamed, id, score, body, tokens)

// Declared and json-convertible, but opted into CBOR.
struct Both {
  int v = 0;
  std::string s;
  friend bool operator==(const Both&, const Both&) = default;
};
ACCEL_DEFINE_FIELDS(Both, v, s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Both, v, s)
}  // namespace demo

template <>
struct accel::force_json_serialization<demo::Both> : std::true_type {};

namespace {
template <class T>
T round_trip(const T& v) {
  return accel::from_bytes<T>(accel::to_bytes(v), 3);
}
demo::Rich sample() {
  demo::Rich r;
  r.beams = {{1, 0.5, "hello", {1, 2, 3}}, {2, -1.25, std::string("nul\0inside", 10), {}}};
  r.error = "too long";
  r.logits = {{"a", {0.5f, 1.5f}}, {"", {}}};
  r.names = {{7, "seven"}, {-1, ""}};
  r.stop = {true, demo::Stop::stop_word};
  r.misc = {65535, "x", demo::Span{3, 9}};
  r.spans = {demo::Span{1, 2}, demo::Span{3, 4}};
  r.more_spans = {{5, 6}};
  r.cached = true;
  return r;
}
}  // namespace

TEST_CASE("fields: declared structs and containers of them round-trip through the binary form", "[fields]") {
  const demo::Completion c{7, 0.25, "text", {4, 5}};
  REQUIRE(round_trip(c) == c);
  const std::vector<demo::Completion> v = {c, {}, {-3, 1e300, std::string(1000, 'z'), std::vector<int>(100, 9)}};
  REQUIRE(round_trip(v) == v);
  REQUIRE(round_trip(sample()) == sample());
  REQUIRE(round_trip(demo::Rich{}) == demo::Rich{});
  REQUIRE(round_trip(std::vector<demo::Rich>{sample(), {}, sample()}) == std::vector<demo::Rich>{sample(), {}, sample()});
  // Containers without any declared struct take the binary form too.
  const std::map<std::string, std::vector<int>> m = {{"a", {1}}, {"b", {}}};
  REQUIRE(round_trip(m) == m);
  const std::vector<std::vector<std::string>> nested = {{"a", ""}, {}, {"ccc"}};
  REQUIRE(round_trip(nested) == nested);
  REQUIRE(accel::to_bytes(v)[0] == std::byte{6});
  REQUIRE(accel::to_bytes(m)[0] == std::byte{6});
}

TEST_CASE("fields: the encoding is compact: counts, then the bytes, no names or tags per item", "[fields]") {
  const demo::Completion c{1, 2.0, "abc", {1, 2}};
  // 16-byte header (format, padding, fingerprint), then int, double, u64 + 3 chars, u64 + 2 ints.
  REQUIRE(accel::to_bytes(c).size() == 16 + 4 + 8 + (8 + 3) + (8 + 8));
  REQUIRE(accel::to_bytes(std::vector<demo::Completion>(10, c)).size() == 16 + 8 + 10 * (4 + 8 + 11 + 16));
  // Vectors of plain items are one block.
  REQUIRE(accel::to_bytes(std::vector<std::vector<std::int16_t>>{{1, 2, 3}}).size() == 16 + 8 + 8 + 6);
}

TEST_CASE("fields: ACCEL_DEFINE_FIELDS records the member names in order", "[fields]") {
  const auto f = accel_fields(accel::fields_tag<demo::Completion>{});
  REQUIRE(f.names.size() == 4);
  REQUIRE(f.names[0] == "id");
  REQUIRE(f.names[2] == "text");
  REQUIRE(f.names[3] == "tokens");
  REQUIRE(accel::detail::binary::shape<demo::Completion>() == "{id:i4,score:f8,text:s,tokens:v(i4)}");
  REQUIRE(accel::detail::binary::shape<std::vector<std::optional<demo::Stop>>>() == "v(o(e1))");
}

TEST_CASE("fields: a payload of a struct of another shape is rejected naming the rank", "[fields]") {
  const auto bytes = accel::to_bytes(std::vector<demo::Completion>{{1, 2.0, "abc", {1}}});
  REQUIRE_THROWS_AS(accel::from_bytes<std::vector<demo::Renamed>>(bytes, 2), accel::serialization_error);
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<demo::Renamed>>(bytes, 2),
                      accel_test::contains("from rank 2") && accel_test::contains("another shape"));
  REQUIRE_THROWS_WITH(accel::from_bytes<demo::Completion>(bytes, 1), accel_test::contains("another shape"));
}

TEST_CASE("fields: truncated, extended and corrupted payloads are serialization errors, never crashes", "[fields]") {
  const auto good = accel::to_bytes(std::vector<demo::Rich>{sample(), sample()});
  using T = std::vector<demo::Rich>;
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::vector<std::byte> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    REQUIRE_THROWS_AS(accel::from_bytes<T>(cut, 1), accel::serialization_error);
  }
  auto longer = good;
  longer.push_back(std::byte{0});
  REQUIRE_THROWS_WITH(accel::from_bytes<T>(longer, 1), accel_test::contains("trailing"));

  // A count that promises more items than bytes follow fails before allocating.
  auto huge = accel::to_bytes(std::vector<demo::Completion>{{}});
  const std::uint64_t lots = std::uint64_t{1} << 60;
  std::memcpy(huge.data() + 16, &lots, 8);
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<demo::Completion>>(huge, 0), accel_test::contains("announces"));

  // Bytes that no bool or optional flag may hold.
  auto flag = accel::to_bytes(std::optional<int>(5));
  REQUIRE(flag[0] == std::byte{1});  // trivially copyable: raw, not binary
  auto opt = accel::to_bytes(std::vector<std::optional<std::string>>{std::nullopt});
  opt.back() = std::byte{2};
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<std::optional<std::string>>>(opt, 0), accel_test::contains("optional flag 2"));
  auto b = accel::to_bytes(std::pair<bool, std::string>{true, ""});
  b[16] = std::byte{7};
  REQUIRE_THROWS_WITH((accel::from_bytes<std::pair<bool, std::string>>(b, 0)), accel_test::contains("bool byte 7"));
}

TEST_CASE("fields: force_json_serialization sends a declared struct through CBOR", "[fields]") {
  const demo::Both v{3, "three"};
  REQUIRE(accel::to_bytes(v)[0] == std::byte{5});
  REQUIRE(round_trip(v) == v);
}
