// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include "../tools/commands/args.hpp"

#include <array>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace {
constexpr accel_cli::OptionSpec specs[] = {
    {"max-memory", true, false, "BUDGETS", "per-device budgets"},
    {"no-split", true, true, "PATTERN", "never split these"},
    {"json", false, false, "", "print JSON"},
};

accel_cli::ParsedArgs parse(std::vector<std::string> words, bool positional = false) {
  static std::vector<std::string> storage;
  storage = std::move(words);
  storage.insert(storage.begin(), "plan");
  static std::vector<char*> argv;
  argv.clear();
  for (auto& w : storage) argv.push_back(w.data());
  return accel_cli::parse_args(std::span<char*>(argv), specs, positional);
}
}  // namespace

TEST_CASE("options accept space, equals, underscore and hyphen spellings", "[args]") {
  auto a = parse({"--max_memory", "0=1GiB", "--no-split=A", "--no_split", "B", "--json"});
  CHECK(a.value("max-memory") == std::optional<std::string>("0=1GiB"));
  CHECK(a.values("no-split") == std::vector<std::string>{"A", "B"});
  CHECK(a.has("json"));
  CHECK_FALSE(a.help());
  CHECK_FALSE(a.has("missing"));
  CHECK(parse({"-h"}).help());
}

TEST_CASE("bad command lines are usage errors naming the offending word", "[args]") {
  REQUIRE_THROWS_WITH(parse({"--bogus"}), accel_test::contains("unknown option '--bogus'"));
  REQUIRE_THROWS_WITH(parse({"-x"}), accel_test::contains("unknown option '-x'"));
  REQUIRE_THROWS_WITH(parse({"--max-memory"}), accel_test::contains("'--max-memory' needs a value (BUDGETS)"));
  REQUIRE_THROWS_WITH(parse({"--json=1"}), accel_test::contains("is a flag and takes no value"));
  REQUIRE_THROWS_WITH(parse({"--json", "--json"}), accel_test::contains("given more than once"));
  REQUIRE_THROWS_WITH(parse({"stray"}), accel_test::contains("unexpected argument 'stray'"));
  REQUIRE_THROWS_AS(parse({"--bogus"}), accel::usage_error);
}

TEST_CASE("positional arguments are collected when allowed, also after --", "[args]") {
  auto a = parse({"x", "--json", "--", "--not-an-option"}, true);
  CHECK(a.positional() == std::vector<std::string>{"x", "--not-an-option"});
}

TEST_CASE("help text lists every option with its value name", "[args]") {
  auto text = accel_cli::format_help("usage: accel plan", specs);
  CHECK(text.find("--max-memory BUDGETS") != std::string::npos);
  CHECK(text.find("(repeatable)") != std::string::npos);
  CHECK(text.find("--help") != std::string::npos);
}
