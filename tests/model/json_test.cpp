// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/model/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

#include "support/catch.hpp"

namespace {
std::string nested_arrays(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }
std::string nested_objects(std::size_t depth) {
  std::string s;
  for (std::size_t i = 0; i < depth; ++i) s += "{\"a\":";
  return s + "1" + std::string(depth, '}');
}
}  // namespace

TEST_CASE("strict JSON rejects duplicate keys at any depth and accepts a clean document", "[json]") {
  CHECK(accel::parse_json_strict(R"({"a": 1, "b": {"c": 2}})").error.empty());
  CHECK(accel::parse_json_strict(R"({"a": 1, "a": 2})").error == "duplicate key 'a'");
  CHECK(accel::parse_json_strict(R"({"x": [{"k": 1, "k": 1}]})").error == "duplicate key 'k'");
  CHECK_FALSE(accel::parse_json_strict(R"({"a": 1} x)").error.empty());
}

TEST_CASE("strict JSON stops at the nesting limit with an error instead of building a deep value", "[json]") {
  CHECK(accel::parse_json_strict(nested_arrays(accel::json_max_depth)).error.empty());
  CHECK(accel::parse_json_strict(nested_objects(accel::json_max_depth)).error.empty());
  for (const auto& text : {nested_arrays(accel::json_max_depth + 1), nested_objects(accel::json_max_depth + 1),
                           nested_arrays(100'000), nested_objects(100'000)}) {
    const auto r = accel::parse_json_strict(text);
    CHECK(r.error == "nested deeper than 256 levels");
    CHECK(r.value.is_null());
  }
}

TEST_CASE("json_excerpt quotes a bounded, readable piece of any value", "[json]") {
  CHECK(accel::json_excerpt(nlohmann::json("big")) == "\"big\"");
  CHECK(accel::json_excerpt(nlohmann::json::parse("[1, [2, [3, [4, [5]]]]]")) == "[1, [2, [3, [...]]]]");
  CHECK(accel::json_excerpt(nlohmann::json::parse(R"({"k": {"x": 1}})")) == R"({"k": {"x": 1}})");
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 100'000; ++i) big.push_back(i);
  const auto e = accel::json_excerpt(big, 40);
  CHECK(e.size() <= 43);
  CHECK(e.starts_with("[0, 1, 2, 3"));
  CHECK(e.ends_with("..."));
  // A value nested past the parser's limit (built in code) still prints in bounded stack.
  nlohmann::json deep = 1;
  for (int i = 0; i < 10'000; ++i) deep = nlohmann::json::array({std::move(deep)});
  CHECK(accel::json_excerpt(deep) == "[[[[...]]]]");
}

TEST_CASE("json_whole_number accepts whole counts below 2^64 and never casts out of range", "[json]") {
  using accel::json_whole_number;
  using nlohmann::json;
  CHECK(json_whole_number(json(7u)) == std::optional<std::uint64_t>(7));
  CHECK(json_whole_number(json::parse("1e9")) == std::optional<std::uint64_t>(1'000'000'000));
  CHECK(json_whole_number(json::parse("18446744073709551615")) == std::optional<std::uint64_t>(UINT64_MAX));
  for (const char* bad : {"1e30", "18446744073709551616", "1.5", "-1", "-0.5", "\"5\"", "true", "null", "[1]"}) {
    INFO(bad);
    CHECK_FALSE(json_whole_number(json::parse(bad)));
  }
}

TEST_CASE("read_text_file on a folder is a checkpoint_error naming it, not a stream exception", "[json]") {
  const auto folder = std::filesystem::temp_directory_path();
  REQUIRE_THROWS_AS(accel::read_text_file(folder, "model skeleton"), accel::checkpoint_error);
  REQUIRE_THROWS_WITH(accel::read_text_file(folder, "model skeleton"),
                      accel_test::contains("cannot read model skeleton '" + folder.string() + "': it is a folder"));
}

TEST_CASE("the fast JSON cursor reads strings of printable ASCII and declines any other byte at any position", "[json]") {
  // The cursor checks eight bytes at a time: a bad byte in any lane of a word, or in the tail.
  for (std::size_t length = 0; length <= 20; ++length) {
    for (int c = 0x20; c <= 0x7e; ++c) {
      if (c == '"' || c == '\\') continue;
      const std::string body(length, static_cast<char>(c));
      const std::string text = "\"" + body + "\"";
      accel::detail::PlainJsonCursor cursor(text);
      const auto read = cursor.string();
      REQUIRE(read == std::optional<std::string_view>(body));
    }
    for (std::size_t at = 0; at < length; ++at)
      for (int bad : {0x00, 0x01, 0x1f, 0x7f, 0x80, 0xc3, 0xff, 0x5c}) {
        std::string body(length, 'a');
        body[at] = static_cast<char>(bad);
        const std::string text = "\"" + body + "\"";
        accel::detail::PlainJsonCursor cursor(text);
        INFO("length " << length << ", byte " << bad << " at " << at);
        REQUIRE_FALSE(cursor.string());
      }
  }
}

TEST_CASE("the fast JSON cursor reads unsigned integers up to 2^64 - 1 and declines the rest", "[json]") {
  // Oracle: decimal digits only, no leading zero, at most UINT64_MAX, not followed by a fraction or
  // an exponent (then the strict parser decides).
  const auto expected = [](const std::string& digits, char after) -> std::optional<std::uint64_t> {
    if (digits.empty() || (digits[0] == '0' && digits.size() > 1) || after == '.' || after == 'e' || after == 'E') return std::nullopt;
    const std::string max = "18446744073709551615";
    if (digits.size() > max.size() || (digits.size() == max.size() && digits > max)) return std::nullopt;
    return std::stoull(digits);
  };
  std::vector<std::string> cases = {"0", "7", "01", "00", "10", "9999999999999999999", "10000000000000000000",
                                    "18446744073709551615", "18446744073709551616", "18446744073709551699",
                                    "19999999999999999999", "99999999999999999999", "100000000000000000000",
                                    "000000000000000000000", "123456789012345678901234"};
  std::uint64_t state = 12345;
  for (int i = 0; i < 2000; ++i) {  // every length, with random digits
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    std::string d(static_cast<std::size_t>(1 + (state >> 59) % 22), '0');
    for (auto& ch : d) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      ch = static_cast<char>('0' + (state >> 60) % 10);
    }
    cases.push_back(d);
  }
  for (const auto& digits : cases)
    for (const char* after : {"", ",", "]", " ", ".5", "e3", "E3"}) {
      const std::string text = digits + after;
      accel::detail::PlainJsonCursor cursor(text);
      INFO(text);
      REQUIRE(cursor.unsigned_integer() == expected(digits, after[0]));
    }
}
