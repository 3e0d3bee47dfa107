// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Value <-> bytes: raw fast path, CBOR for json-convertible types, and every malformed input rejected.
#include <accel/comm/serialize.hpp>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace demo {
struct Result {
  int id = 0;
  std::string text;
  std::vector<double> scores;
  std::map<std::string, int> extra;
  friend bool operator==(const Result&, const Result&) = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Result, id, text, scores, extra)

struct Point {
  float x, y;
  std::int32_t tag;
  friend bool operator==(const Point&, const Point&) = default;
};

struct Picky {
  int v = 0;
};
void to_json(nlohmann::json& j, const Picky& p) {
  if (p.v < 0) throw std::runtime_error("negative values cannot be sent");
  j = p.v;
}
void from_json(const nlohmann::json& j, Picky& p) { p.v = j.get<int>(); }
}  // namespace demo

// Picky is trivially copyable; this opts it out of the raw path so its to_json runs.
template <>
struct accel::force_json_serialization<demo::Picky> : std::true_type {};

namespace {
template <class T>
T round_trip(const T& v) {
  return accel::from_bytes<T>(accel::to_bytes(v));
}
std::vector<std::byte> corrupt(std::vector<std::byte> b, std::size_t at, std::byte value) {
  b.at(at) = value;
  return b;
}
}  // namespace

TEST_CASE("serialize: structs with NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE round-trip through CBOR", "[serialize]") {
  const demo::Result r{7, std::string("h\xc3\xa9llo\0world", 12), {1.5, -2.25}, {}};
  REQUIRE(round_trip(r) == r);
  const std::vector<demo::Result> many = {r, {8, "", {}, {{"n", 1}}}};
  REQUIRE(round_trip(many) == many);
  const std::map<std::string, std::vector<int>> m = {{"a", {1}}, {"b", {}}};
  REQUIRE(round_trip(m) == m);
  REQUIRE(accel::to_bytes(r)[0] == std::byte{5});
}

TEST_CASE("serialize: trivially copyable values, strings and vectors of them take the raw path", "[serialize]") {
  REQUIRE(round_trip(42) == 42);
  REQUIRE(round_trip(demo::Point{1.f, 2.f, 3}) == demo::Point{1.f, 2.f, 3});
  REQUIRE(round_trip(std::array<int, 3>{1, 2, 3}) == std::array<int, 3>{1, 2, 3});
  REQUIRE(round_trip(std::string("bytes\0inside", 12)) == std::string("bytes\0inside", 12));
  REQUIRE(round_trip(std::vector<demo::Point>{{1, 2, 3}, {4, 5, 6}}) == std::vector<demo::Point>{{1, 2, 3}, {4, 5, 6}});
  REQUIRE(round_trip(std::vector<std::byte>(1000, std::byte{9})) == std::vector<std::byte>(1000, std::byte{9}));
  REQUIRE(round_trip(std::vector<std::string>{"a", "", "ccc"}) == std::vector<std::string>{"a", "", "ccc"});
  REQUIRE(round_trip(std::vector<int>{}).empty());
  REQUIRE(round_trip(std::vector<bool>{true, false}) == std::vector<bool>{true, false});  // not raw: CBOR
  // Raw layouts: a 32-byte header (format, item size, count), then the bytes; no per-item overhead.
  REQUIRE(accel::to_bytes(std::vector<std::int32_t>(10)).size() == 32 + 40);
  REQUIRE(accel::to_bytes(std::string(5, 'x')).size() == 6);
  REQUIRE(accel::to_bytes(std::vector<bool>{true})[0] == std::byte{5});
}

TEST_CASE("serialize: a payload of the wrong type is rejected naming the rank", "[serialize]") {
  const auto ints = accel::to_bytes(std::vector<int>{1, 2});
  REQUIRE_THROWS_AS(accel::from_bytes<std::vector<double>>(ints, 3), accel::serialization_error);
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<double>>(ints, 3),
                      accel_test::contains("value from rank 3 holds 4-byte signed-integer items but std::vector<double"));
  REQUIRE_THROWS_WITH(accel::from_bytes<std::string>(ints, 1),
                      accel_test::contains("value from rank 1 has format 3 but a std::__cxx11::basic_string"));
  REQUIRE_THROWS_WITH(accel::from_bytes<demo::Result>(accel::to_bytes(std::vector<std::string>{"x"}), 2),
                      accel_test::contains("do all ranks pass the same type"));
  REQUIRE_THROWS_WITH(accel::from_bytes<int>({}, 0), accel_test::contains("empty value from rank 0 cannot be a int"));
}

TEST_CASE("serialize: plain data of the same size but another type is an error naming both, never reinterpreted", "[serialize]") {
  using accel_test::contains;
  // Same item size, other kind: these used to decode as garbage.
  const auto i64 = accel::to_bytes(std::vector<std::int64_t>{1, 2});
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<double>>(i64, 1),
                      contains("value from rank 1 holds 8-byte signed-integer items but std::vector<double, std::allocator<double> > "
                               "has 8-byte floating-point items"));
  REQUIRE_THROWS_WITH(accel::from_bytes<float>(accel::to_bytes(7), 0), contains("holds 4-byte signed-integer items but float has 4-byte floating-point"));
  REQUIRE_THROWS_WITH(accel::from_bytes<unsigned>(accel::to_bytes(7), 0), contains("but unsigned int has 4-byte unsigned-integer"));
  // Same kind and size, other struct: caught by the fingerprint.
  struct A { int x, y; };
  struct B { int x, y; };
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<B>>(accel::to_bytes(std::vector<A>{{1, 2}}), 2),
                      contains("value from rank 2 holds 8-byte plain-data items of another type than the items of"));
  // Spellings of one arithmetic type agree (long and long long are both 8-byte signed integers).
  static_assert(sizeof(long) == sizeof(long long));
  CHECK(accel::from_bytes<std::vector<long long>>(accel::to_bytes(std::vector<long>{5, 6})) == std::vector<long long>{5, 6});
  CHECK(accel::from_bytes<demo::Point>(accel::to_bytes(demo::Point{1.f, 2.f, 3})) == demo::Point{1.f, 2.f, 3});
}

TEST_CASE("serialize: truncated, padded and corrupted payloads are errors, never crashes", "[serialize]") {
  auto v = accel::to_bytes(std::vector<std::int64_t>{1, 2, 3});
  auto cut = std::vector<std::byte>(v.begin(), v.end() - 1);
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<std::int64_t>>(cut, 2), accel_test::contains("value from rank 2 announces 3 items"));
  auto longer = v;
  longer.push_back(std::byte{0});
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<std::int64_t>>(longer, 2), accel_test::contains("but 25 bytes follow"));
  REQUIRE_THROWS_WITH(accel::from_bytes<std::int64_t>(corrupt(accel::to_bytes(std::int64_t{1}), 16, std::byte{2}), 2),
                      accel_test::contains("is not one long"));
  REQUIRE(accel::from_bytes<std::string>(std::vector<std::byte>{std::byte{2}}, 0).empty());
  // A huge item count in a tiny payload does not allocate.
  auto huge = corrupt(corrupt(v, 23, std::byte{0xff}), 22, std::byte{0xff});
  REQUIRE_THROWS_AS(accel::from_bytes<std::vector<std::int64_t>>(huge, 0), accel::serialization_error);
  auto sv = accel::to_bytes(std::vector<std::string>{"abc", "de"});
  REQUIRE_THROWS_WITH(accel::from_bytes<std::vector<std::string>>(corrupt(sv, 9, std::byte{50}), 1), accel_test::contains("truncated"));
  auto cbor = accel::to_bytes(demo::Result{1, "x", {}, {}});
  REQUIRE_THROWS_WITH(accel::from_bytes<demo::Result>(std::vector<std::byte>(cbor.begin(), cbor.begin() + 5), 4),
                      accel_test::contains("value from rank 4 is not a valid demo::Result: [json.exception.parse_error"));
  REQUIRE_THROWS_WITH(accel::from_bytes<demo::Result>(accel::to_bytes(nlohmann::json{{"id", 1}}), 4),
                      accel_test::contains("value from rank 4 is not a valid demo::Result: [json.exception.out_of_range"));
  // Every single-byte prefix of a CBOR payload fails cleanly.
  for (std::size_t n = 1; n < cbor.size(); ++n)
    REQUIRE_THROWS_AS(accel::from_bytes<demo::Result>(std::span<const std::byte>(cbor.data(), n), 0), accel::serialization_error);
}

TEST_CASE("serialize: a to_json that throws becomes a serialization_error naming type and rank", "[serialize]") {
  REQUIRE_THROWS_WITH(accel::to_bytes(demo::Picky{-1}, 5),
                      accel_test::contains("[accel.serialization] cannot encode a demo::Picky on rank 5: negative values cannot be sent"));
  REQUIRE(round_trip(demo::Picky{3}).v == 3);
  REQUIRE(accel::to_bytes(demo::Picky{3})[0] == std::byte{5});
}
