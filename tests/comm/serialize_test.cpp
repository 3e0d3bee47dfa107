// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Value <-> bytes: raw fast path, CBOR for json-convertible types, and every malformed input rejected.
#include <accel/comm/serialize.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/cbor_reader.hpp"

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
                      accel_test::contains("value from rank 4 is not a valid demo::Result: CBOR: a length of 5 bytes, but 2 are left (at byte 2)"));
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

namespace {
// A random JSON value: every CBOR major type nlohmann writes, objects whose keys come and go.
nlohmann::json random_json(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> kind(0, depth > 3 ? 6 : 9);
  const char* keys[] = {"a", "b", "id", "text", "tokens", "zz"};
  switch (kind(rng)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<std::int64_t>(rng()) - (std::int64_t{1} << 31);
    case 3: return static_cast<std::uint64_t>(rng()) << 32;
    case 4: return static_cast<double>(rng()) / 7.0;
    case 5: return std::string(rng() % 40, static_cast<char>('a' + rng() % 26));
    case 6: return nlohmann::json::binary({1, 2, static_cast<std::uint8_t>(rng())});  // with a subtype nlohmann writes a tag it refuses to read
    case 7: case 8: {
      auto o = nlohmann::json::object();
      for (const char* k : keys)
        if (rng() % 2) o[k] = random_json(rng, depth + 1);
      return o;
    }
    default: {
      auto a = nlohmann::json::array();
      for (std::size_t i = rng() % 5; i > 0; --i) a.push_back(random_json(rng, depth + 1));
      return a;
    }
  }
}
}  // namespace

TEST_CASE("serialize: vectors through CBOR are written and read one item at a time, byte-identical to nlohmann's whole-value CBOR", "[serialize]") {
  std::mt19937 rng(11);
  for (std::size_t n : {0, 1, 23, 24, 255, 256, 300, 65535, 65536, 70000}) {
    std::vector<demo::Result> items(n);
    for (std::size_t i = 0; i < n; ++i) items[i] = {static_cast<int>(i), std::string(i % 37, 'x'), {0.5 * static_cast<double>(i)}, {}};
    std::vector<std::uint8_t> whole{5};
    nlohmann::json::to_cbor(nlohmann::json(items), whole);
    const auto ours = accel::to_bytes(items);
    REQUIRE(ours.size() == whole.size());
    REQUIRE(std::memcmp(ours.data(), whole.data(), whole.size()) == 0);
    REQUIRE(round_trip(items) == items);
  }
  // Items of changing shapes decode into the value nlohmann's own parser builds, item by item,
  // also into a vector that holds other values already (fewer, more, other shapes).
  std::vector<nlohmann::json> reused;
  for (int round = 0; round < 300; ++round) {
    std::vector<nlohmann::json> items(rng() % 12);
    for (auto& j : items) j = random_json(rng, 0);
    const auto bytes = accel::to_bytes(items);
    std::vector<std::uint8_t> whole{5};
    nlohmann::json::to_cbor(nlohmann::json(items), whole);
    REQUIRE(std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()),
                                      reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size()) == whole);
    const auto reference = nlohmann::json::from_cbor(reinterpret_cast<const std::uint8_t*>(bytes.data()) + 1,
                                                     reinterpret_cast<const std::uint8_t*>(bytes.data()) + bytes.size());
    REQUIRE(nlohmann::json(accel::from_bytes<std::vector<nlohmann::json>>(bytes)) == reference);
    accel::from_bytes_into(bytes, reused);
    REQUIRE(nlohmann::json(reused) == reference);
  }
  REQUIRE(round_trip(std::vector<bool>{true, false, true}) == std::vector<bool>{true, false, true});
  // The writer's corner cases, byte for byte: float widths, NaN and infinities, integer limits,
  // binary subtypes (tags), long strings and arrays.
  const auto corners = nlohmann::json::array(
      {0.5, 0.1, 1e300, -1e-300, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
       -std::numeric_limits<double>::infinity(), 3.4028234663852886e38, std::numeric_limits<std::int64_t>::min(),
       std::numeric_limits<std::uint64_t>::max(), -24, -25, -256, -257, 65535, 65536, 4294967295ull, 4294967296ull,
       nlohmann::json::binary({1, 2}, 7), nlohmann::json::binary({3}, 300), nlohmann::json::binary({}, 70000),
       std::string(70000, 'q'), nlohmann::json::array(), nlohmann::json::object(), nlohmann::json(std::vector<int>(300, 1))});
  for (const auto& j : corners) {
    std::vector<std::byte> ours;
    accel::detail::put_cbor(ours, j);
    const auto theirs = nlohmann::json::to_cbor(j);
    INFO(j.dump());
    REQUIRE(ours.size() == theirs.size());
    REQUIRE(std::memcmp(ours.data(), theirs.data(), theirs.size()) == 0);
  }
  // An indefinite-length array (not what nlohmann writes, but valid CBOR) reads as nlohmann reads it.
  const std::vector<std::byte> indefinite{std::byte{5}, std::byte{0x9f}, std::byte{0x01}, std::byte{0x9f}, std::byte{0x02},
                                          std::byte{0xff}, std::byte{0xff}};
  REQUIRE(nlohmann::json(accel::from_bytes<std::vector<nlohmann::json>>(indefinite)) == nlohmann::json::parse("[1, [2]]"));
}

TEST_CASE("serialize: hostile CBOR for a vector is an error naming the rank, never a crash", "[serialize]") {
  using Items = std::vector<demo::Result>;
  // 100k nested arrays inside the vector: refused at the depth limit, before the reader recurses.
  std::vector<std::byte> deep{std::byte{5}, std::byte{0x81}};
  deep.insert(deep.end(), 100000, std::byte{0x81});
  deep.push_back(std::byte{0x01});
  REQUIRE_THROWS_WITH(accel::from_bytes<Items>(deep, 3), accel_test::contains("value from rank 3 is not a valid") &&
                                                              accel_test::contains("nested more than 512 deep"));
  REQUIRE_THROWS_WITH(accel::from_bytes<demo::Result>(deep, 3), accel_test::contains("nested more than 512 deep"));  // a single value too
  // Not an array at the top.
  REQUIRE_THROWS_WITH(accel::from_bytes<Items>(accel::to_bytes(demo::Result{}), 1), accel_test::contains("a single value, not an array, where a vector's items belong"));
  // Items that are not Results, trailing bytes, and every prefix.
  REQUIRE_THROWS_WITH(accel::from_bytes<Items>(accel::to_bytes(std::vector<int>{1, 2}), 2), accel_test::contains("has format 3"));
  REQUIRE_THROWS_WITH(accel::from_bytes<Items>(accel::to_bytes(std::vector<nlohmann::json>{1}), 2),
                      accel_test::contains("value from rank 2 is not a valid std::vector<demo::Result") && accel_test::contains("type_error"));
  auto bytes = accel::to_bytes(Items{{1, "a", {2.0}, {{"k", 3}}}, {2, "b", {}, {}}});
  auto longer = bytes;
  longer.push_back(std::byte{0x01});
  REQUIRE_THROWS_WITH(accel::from_bytes<Items>(longer, 0), accel_test::contains("CBOR: 1 byte after the end of the value"));
  Items into{{9, "old", {}, {}}};
  for (std::size_t n = 1; n < bytes.size(); ++n) {
    REQUIRE_THROWS_AS(accel::from_bytes<Items>(std::span<const std::byte>(bytes.data(), n), 0), accel::serialization_error);
    REQUIRE_THROWS_AS(accel::from_bytes_into(std::span<const std::byte>(bytes.data(), n), into, 0), accel::serialization_error);
  }
  accel::from_bytes_into(bytes, into, 0);
  REQUIRE(into == accel::from_bytes<Items>(bytes));
}

TEST_CASE("serialize: accel's CBOR reader reads what nlohmann reads on mutated and truncated encodings", "[serialize]") {
  std::mt19937 rng(5);
  std::map<std::string, int> verdicts;
  for (int round = 0; round < 4000; ++round) {
    std::vector<nlohmann::json> items(1 + rng() % 4);
    for (auto& j : items) j = random_json(rng, 0);
    std::vector<std::uint8_t> bytes;
    nlohmann::json::to_cbor(round % 4 ? nlohmann::json(items) : items[0], bytes);  // arrays, and single values
    if (bytes.size() < 2) continue;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      const std::size_t at = rng() % (bytes.size() + 1);
      switch (rng() % 4) {
        case 0: if (at < bytes.size()) bytes[at] = static_cast<std::uint8_t>(rng()); break;
        case 1: bytes.resize(std::min(bytes.size(), at)); break;
        case 2: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(std::min(at, bytes.size())), static_cast<std::uint8_t>(rng())); break;
        default: if (at < bytes.size()) bytes[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8)); break;
      }
    }
    const std::string v = accel_test::cbor_verdict(bytes.data(), bytes.data() + bytes.size());
    INFO(nlohmann::json::binary(bytes).dump() << " -> " << v);
    REQUIRE((v == "agrees" || v == "both refuse" || v == "documented difference"));
    ++verdicts[v];
  }
  // The mutations reach both outcomes often.
  REQUIRE(verdicts["agrees"] > 400);
  REQUIRE(verdicts["both refuse"] > 400);
}
