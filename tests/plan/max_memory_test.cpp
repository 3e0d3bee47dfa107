// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
#include <accel/plan/max_memory.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"

using accel::parse_byte_size;

TEST_CASE("byte sizes follow accelerate's units, truncation and the bits rule", "[memory]") {
  CHECK(parse_byte_size("20GiB") == 20ull << 30);
  CHECK(parse_byte_size("5gib") == 5ull << 30);  // binary units are never bits
  CHECK(parse_byte_size("1.5GB") == 1500000000ull);
  CHECK(parse_byte_size("8.2GB") == 8199999999ull);  // float rounding, as Python
  CHECK(parse_byte_size("3.7MiB") == 3879731ull);
  CHECK(parse_byte_size("5Mb") == 625000ull);
  CHECK(parse_byte_size("5mb") == 625000ull);
  CHECK(parse_byte_size("1kb") == 125ull);
  CHECK(parse_byte_size("1Gb") == 125000000ull);
  CHECK(parse_byte_size(" 5GB") == 5000000000ull);
  CHECK(parse_byte_size("5 GB") == 5000000000ull);
  CHECK(parse_byte_size("1e3MB") == 1000000000ull);
  CHECK(parse_byte_size("2TiB") == 2ull << 40);
  CHECK(parse_byte_size("2TB") == 2000000000000ull);
  CHECK(parse_byte_size("1024") == 1024ull);
  CHECK(parse_byte_size("1.5e3") == 1500ull);
}

TEST_CASE("bad byte sizes are config errors naming the string and the units", "[memory]") {
  using accel_test::contains;
  for (const char* bad : {"5B", "5MBB", "5k0MB", "-1GB", "nanGB", "infGB", "", "GB", "abc"}) {
    INFO(bad);
    REQUIRE_THROWS_AS(parse_byte_size(bad), accel::config_error);
  }
  REQUIRE_THROWS_WITH(parse_byte_size("5MBB"), contains("invalid memory size '5MBB' (unknown unit or not a number)"));
  REQUIRE_THROWS_WITH(parse_byte_size("-1GB"), contains("'-1GB' (a size cannot be negative; 0 gives nothing)"));
  REQUIRE_THROWS_WITH(parse_byte_size("-1"), contains("'-1' (a size cannot be negative; 0 gives nothing)"));
  REQUIRE_THROWS_WITH(parse_byte_size(" -0.5 KiB"), contains("(a size cannot be negative"));
  REQUIRE_THROWS_WITH(parse_byte_size("--1"), contains("(unknown unit or not a number)"));
  REQUIRE_THROWS_WITH(parse_byte_size("99999999999TiB"), contains("larger than 2^64 bytes"));
  REQUIRE_THROWS_WITH(parse_byte_size("x"), contains("KiB/MiB/GiB/TiB"));
}

TEST_CASE("max_memory parses key=value lists and JSON objects", "[memory]") {
  auto m = accel::parse_max_memory("1=10GiB, 0=20GiB,cpu=64GiB,disk=1TB");
  CHECK(m.gpus.at(0) == 20ull << 30);
  CHECK(m.gpus.at(1) == 10ull << 30);
  CHECK(m.gpus.begin()->first == 0);
  CHECK(m.cpu == std::optional<std::uint64_t>(64ull << 30));
  CHECK(m.disk == std::optional<std::uint64_t>(1000000000000ull));
  auto j = accel::parse_max_memory(R"({"0": "20GiB", "cpu": 68719476736, "disk": 0})");
  CHECK(j.gpus.at(0) == 20ull << 30);
  CHECK(j.cpu == std::optional<std::uint64_t>(68719476736ull));
  CHECK(j.disk == std::optional<std::uint64_t>(0));
  CHECK(accel::parse_max_memory("cpu=1024").to_string() == "cpu=1.00 KiB");
}

TEST_CASE("bad max_memory keys and values are config errors naming them", "[memory]") {
  using accel_test::contains;
  REQUIRE_THROWS_WITH(accel::parse_max_memory("cuda:0=1GiB"), contains("unknown max_memory key 'cuda:0'"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("gpu=1GiB"), contains("unknown max_memory key 'gpu'"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("0=lots"), contains("invalid memory size 'lots'"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("0"), contains("max_memory entry '0' has no '='"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("0=1GiB,0=2GiB"), contains("key '0' is given twice"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(""), contains("empty max_memory"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(","), contains("names no device"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"0": true})"), contains("max_memory value for '0' is true"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"0": -5})"), contains("max_memory value for '0' is -5"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"mps": 5})"), contains("unknown max_memory key 'mps'"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("{"), contains("is not valid JSON"));
  REQUIRE_THROWS_AS(accel::parse_max_memory("x=1"), accel::config_error);
}

TEST_CASE("budgets are whole byte counts: JSON floats, huge numbers and fractional bytes are refused", "[memory]") {
  using accel_test::contains;
  // Each of these used to become a budget of 0 or 1 byte (an out-of-range or truncating cast).
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"cpu": 1e30})"), contains("max_memory value for 'cpu' is 1e+30; use a whole byte count"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"0": 1e30})"), contains("max_memory value for '0' is 1e+30"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"cpu": 18446744073709551616})"), contains("max_memory value for 'cpu' is"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory(R"({"cpu": 1.5})"), contains("max_memory value for 'cpu' is 1.5"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("cpu=1.5"), contains("invalid memory size '1.5' (a byte count must be a whole number)"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("cpu=18446744073709551616"), contains("larger than 2^64 bytes"));
  REQUIRE_THROWS_WITH(accel::parse_max_memory("{}"), contains("names no device"));
  CHECK(accel::parse_max_memory(R"({"cpu": 18446744073709551615})").cpu == std::optional<std::uint64_t>(UINT64_MAX));
  CHECK(accel::parse_max_memory("cpu=1.5KiB").cpu == std::optional<std::uint64_t>(1536));
}

TEST_CASE("hostile max_memory text gives a short error, never a crash", "[memory]") {
  using accel_test::contains;
  const std::string deep = "{\"cpu\":" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  std::string message;
  try {
    (void)accel::parse_max_memory(deep);
  } catch (const accel::config_error& e) {
    message = e.what();
  }
  CHECK_THAT(message, contains("nested deeper than 256 levels"));
  CHECK(message.size() < 400);  // the input is quoted as an excerpt, not whole
  REQUIRE_THROWS_WITH(accel::parse_max_memory(std::string(10'000, 'x') + "=1"), contains("characters)"));
}

TEST_CASE("a huge max_memory key or entry is quoted as a bounded excerpt in every message", "[memory]") {
  const std::string huge(1'000'000, 'k');
  auto message_of = [](const std::string& text) {
    try {
      (void)accel::parse_max_memory(text);
    } catch (const accel::config_error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  for (const auto& text : {"{\"" + huge + "\": 1.5}",            // a float value under a huge key
                           "0=1GiB," + huge,                     // an entry without '='
                           "{\"cpu\": 1, \"" + huge + "\": [1]}"}) { // a non-number value under a huge key
    const auto message = message_of(text);
    INFO(message.substr(0, 300));
    CHECK(message.size() < 600);
    CHECK_THAT(message, accel_test::contains("... (1000000 characters)"));
  }
}

TEST_CASE("default budgets hold back the stated reserve per GPU and of RAM", "[memory]") {
  std::vector<accel::DeviceBudgetInfo> gpus{{0, 80ull << 30, 79ull << 30}, {1, 8ull << 30, 512ull << 20}};
  auto m = accel::default_max_memory(gpus, 100ull << 30);
  CHECK(m.gpus.at(0) == (79ull << 30) - (8ull << 30));  // 10% of 80 GiB
  CHECK(m.gpus.at(1) == 0);                              // free below the 1 GiB minimum
  CHECK(m.cpu == std::optional<std::uint64_t>(90ull << 30));
  CHECK_FALSE(m.disk.has_value());
  auto none = accel::default_max_memory({}, 1000, {.gpu_fraction = 0, .gpu_min = 0, .cpu_fraction = 0});
  CHECK(none.gpus.empty());
  CHECK(none.cpu == std::optional<std::uint64_t>(1000));
}

TEST_CASE("available RAM is read from meminfo text", "[memory]") {
  CHECK(accel::parse_meminfo_available("MemTotal: 100 kB\nMemAvailable:    2048 kB\n") == std::optional<std::uint64_t>(2097152));
  CHECK_FALSE(accel::parse_meminfo_available("MemTotal: 100 kB\n").has_value());
  CHECK(accel::read_available_ram().value_or(0) > 0);
  CHECK(accel::text::format_bytes(512) == "512 B");
  CHECK(accel::text::format_bytes(3ull << 30) == "3.00 GiB");
}
