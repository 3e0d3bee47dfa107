// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The error hierarchy's prefix, and message_body, which strips it to nest a message in another.
#include <accel/runtime/error.hpp>

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
