// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include "../tools/commands/args.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "support/catch.hpp"

namespace {
using accel_cli::OptionKind;
using accel_cli::Operands;
using accel_cli::Style;

constexpr accel_cli::OptionSpec specs[] = {
    {"max-memory", OptionKind::text, "BUDGETS", "per-device budgets"},
    {"no-split", OptionKind::text, "PATTERN", "never split these", true},
    {"json", OptionKind::flag, "", "print JSON"},
    {"count", OptionKind::integer, "N", "how many", false, 1, 8},
    {"port", OptionKind::integer, "P", "a port", false, 0, 65535},
    {"wait", OptionKind::seconds, "S", "seconds to wait"},
    {"grace", OptionKind::seconds_or_zero, "S", "seconds of grace"},
    {"old-flag", OptionKind::flag, "", "", false, 0, 0, "use --json instead"},
};

accel_cli::ParsedArgs parse(std::vector<std::string> words, Operands operands = Operands::none, Style style = Style::accel) {
  static std::vector<std::string> storage;
  storage = std::move(words);
  storage.insert(storage.begin(), "plan");
  static std::vector<char*> argv;
  argv.clear();
  for (auto& w : storage) argv.push_back(w.data());
  return accel_cli::parse_args(std::span<char*>(argv), {.options = specs, .operands = operands, .style = style});
}

accel_cli::ParsedArgs parse(std::vector<std::string> words, bool positional) {
  return parse(std::move(words), positional ? Operands::list : Operands::none);
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
  CHECK(text.find("--old-flag") == std::string::npos);  // refused options are not offered
}

TEST_CASE("integer and seconds options are checked where they appear, naming the option as typed", "[args]") {
  auto a = parse({"--count", "3", "--port=0", "--wait", "12.5", "--grace", "0"});
  CHECK(a.integer("count") == 3);
  CHECK(a.integer("port") == 0);
  CHECK(a.seconds("wait") == 12.5);
  CHECK(a.seconds("grace") == 0.0);
  CHECK_FALSE(a.integer("missing"));
  CHECK_FALSE(parse({}).seconds("wait"));
  REQUIRE_THROWS_AS(parse({"--count", "0"}), accel::usage_error);
  REQUIRE_THROWS_WITH(parse({"--count", "0"}), accel_test::contains("--count '0' is not a positive integer up to 8"));
  REQUIRE_THROWS_WITH(parse({"--count=x"}), accel_test::contains("--count 'x' is not a positive integer"));
  REQUIRE_THROWS_WITH(parse({"--port", "-1"}), accel_test::contains("--port '-1' is not a non-negative integer up to 65535"));
  REQUIRE_THROWS_WITH(parse({"--wait", "0"}), accel_test::contains("--wait '0' is not a positive number of seconds (e.g. --wait 30)"));
  REQUIRE_THROWS_WITH(parse({"--wait", "0x10"}), accel_test::contains("--wait '0x10'"));
  REQUIRE_THROWS_WITH(parse({"--wait", "nan"}), accel_test::contains("--wait 'nan'"));
  REQUIRE_THROWS_WITH(parse({"--grace", "-1"}), accel_test::contains("--grace '-1' is not a non-negative number of seconds"));
  // The first bad value stops the parse, before a later unknown option is looked at.
  REQUIRE_THROWS_WITH(parse({"--count", "9", "--bogus"}), accel_test::contains("--count '9'"));
}

TEST_CASE("the helpers behind integer and seconds options are usable on their own", "[args]") {
  CHECK(accel_cli::parse_int_option("--n", "64", 1, 64) == 64);
  CHECK(accel_cli::parse_seconds_option("--s", "1e3", false) == 1000.0);
  REQUIRE_THROWS_WITH(accel_cli::parse_int_option("--n", "65", 1, 64),
                      accel_test::contains("--n '65' is not a positive integer up to 64"));
  REQUIRE_THROWS_WITH(accel_cli::parse_seconds_option("--s", "1e8", true),
                      accel_test::contains("--s '1e8' is not a non-negative number"));
}

TEST_CASE("a refused option is named with the reason", "[args]") {
  REQUIRE_THROWS_WITH(parse({"--old_flag"}), accel_test::contains("plan: unknown option '--old_flag': use --json instead"));
  REQUIRE_THROWS_WITH(parse({"--old-flag=1"}), accel_test::contains("unknown option '--old-flag': use --json instead"));
}

TEST_CASE("an option never takes -- as its value", "[args]") {
  REQUIRE_THROWS_WITH(parse({"--max-memory", "--", "x"}, true), accel_test::contains("'--max-memory' needs a value (BUDGETS)"));
}

TEST_CASE("a program starts at the first bare word or after -- and keeps every word after it", "[args]") {
  auto a = parse({"--json", "prog", "--json", "-x", "--", "y"}, Operands::program);
  CHECK(a.has("json"));
  CHECK(a.positional() == std::vector<std::string>{"prog", "--json", "-x", "--", "y"});
  CHECK(parse({"--json", "--", "-prog", "a"}, Operands::program).positional() == std::vector<std::string>{"-prog", "a"});
  CHECK(parse({"-", "a"}, Operands::program).positional() == std::vector<std::string>{"-", "a"});
  CHECK(parse({"--json", "--"}, Operands::program).positional().empty());
  CHECK(parse({"--help"}, Operands::program).help());
  CHECK_FALSE(parse({"prog", "--help"}, Operands::program).help());
  REQUIRE_THROWS_WITH(parse({"--bogus", "prog"}, Operands::program), accel_test::contains("unknown option '--bogus'"));
}

TEST_CASE("the launcher style lets a later option replace an earlier one and names options as typed", "[args]") {
  auto a = parse({"--count", "2", "--count=3", "--max_memory", "a", "--max-memory", "b", "prog"}, Operands::program, Style::launcher);
  CHECK(a.integer("count") == 3);
  CHECK(a.value("max-memory") == std::optional<std::string>("b"));
  CHECK(a.values("max-memory") == std::vector<std::string>{"a", "b"});
  CHECK(a.spelling("max-memory") == "--max-memory");
  CHECK(parse({"--max_memory", "a"}, Operands::program, Style::launcher).spelling("max-memory") == "--max_memory");
  CHECK(parse({}, Operands::program, Style::launcher).spelling("max-memory") == "--max-memory");
  auto fails = [](std::vector<std::string> words) { return parse(std::move(words), Operands::program, Style::launcher); };
  REQUIRE_THROWS_WITH(fails({"--max_memory"}), "[accel.usage] --max_memory needs a value; see accel plan --help");
  REQUIRE_THROWS_WITH(fails({"--max_memory", "--", "prog"}), accel_test::contains("--max_memory needs a value"));
  REQUIRE_THROWS_WITH(fails({"--json=yes", "prog"}), accel_test::contains("--json takes no value (got '--json=yes')"));
  REQUIRE_THROWS_WITH(fails({"--bogus=1", "prog"}), accel_test::contains("unknown option '--bogus'; see accel plan --help"));
  REQUIRE_THROWS_WITH(fails({"-j", "prog"}), "[accel.usage] unknown option '-j'; see accel plan --help");
  REQUIRE_THROWS_WITH(fails({"--old-flag", "prog"}), accel_test::contains("unknown option '--old-flag': use --json instead"));
}
