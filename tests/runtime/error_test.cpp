// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The error hierarchy's prefix, and message_body, which strips it to nest a message in another.
#include <accel/runtime/error.hpp>

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "support/catch.hpp"

TEST_CASE("error: every message starts with its category's prefix; message_body strips exactly that", "[runtime][error]") {
  const accel::planning_error p("stage 0 (a .. b] ) does not fit");
  CHECK(std::string(p.what()) == "[accel.planning] stage 0 (a .. b] ) does not fit");
  CHECK(accel::detail::message_body(p) == "stage 0 (a .. b] ) does not fit");
  // A category with a dot, and a body that itself starts like a prefix: only the error's own goes.
  const accel::timeout_error t("[accel.x] rank 0 did not answer");
  CHECK(t.category() == "comm.timeout");
  CHECK(accel::detail::message_body(t) == "[accel.x] rank 0 did not answer");
  CHECK(accel::detail::message_body(accel::config_error("")).empty());
}

namespace {
template <class... Args>
std::string streamed(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace

TEST_CASE("error: concat writes what a stream writes, with or without its stream-free path", "[runtime][error]") {
  using accel::detail::concat;
  const std::string text("a\0b", 3);
  const std::string_view view = "view";
  const char* c_string = "c string";
  char letters[] = "letters";
  const std::uint8_t byte = 65;  // a stream prints it as a character, 'A'
  const std::int8_t signed_byte = 66;
  const short small = -12;
  const unsigned short usmall = 65535;
  // Stream-free: strings, characters, integers of every width and sign at their extremes.
  REQUIRE(concat("x ", text, ' ', view, c_string, letters, byte, signed_byte, small, usmall) ==
          streamed("x ", text, ' ', view, c_string, letters, byte, signed_byte, small, usmall));
  REQUIRE(concat(std::numeric_limits<std::int64_t>::min(), "|", std::numeric_limits<std::uint64_t>::max(), "|", 0, "|", -1L, "|",
                 std::numeric_limits<int>::min(), "|", 7u) ==
          streamed(std::numeric_limits<std::int64_t>::min(), "|", std::numeric_limits<std::uint64_t>::max(), "|", 0, "|", -1L, "|",
                   std::numeric_limits<int>::min(), "|", 7u));
  REQUIRE(concat("message #", std::uint64_t{12}, " from ", std::string("rank 0")) == "message #12 from rank 0");
  REQUIRE(concat() == std::string());
  const char* none = nullptr;
  REQUIRE(concat("before ", none, "after") == "before after");
  // Through the stream: booleans, floating point, enumerations.
  enum Plain { zero, one };
  REQUIRE(concat(true, ' ', 2.5, ' ', one, ' ', 3) == streamed(true, ' ', 2.5, ' ', one, ' ', 3));
  REQUIRE(concat(true, ' ', 2.5) == "1 2.5");
}
