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
