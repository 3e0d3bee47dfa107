// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file p2p_expected.hpp
/// @brief What tests/multiprocess/children/p2p_child.cpp prints, shared by the tests that run it
///        under accel launch and under the other launchers.
#pragma once

#include <string>

namespace accel_test {

/// @brief The lines rank `r` of p2p_child's `mismatch` mode prints: the same three usage_errors on
///        both ends (a length, an element type, and an object against a span).
inline std::string p2p_mismatch_lines(int r) {
  const std::string tail = "; both ends must pass the same element type and length (send/recv), or the same type (send_object/recv_object)";
  return "rank " + std::to_string(r) +
         ":\n"
         "  usage_error: [accel.usage] send/recv mismatch in message #1 from rank 0 to rank 1: rank 0 sends 4 float32 elements (send), "
         "rank 1 expects 5 float32 elements (recv)" +
         tail +
         "\n"
         "  usage_error: [accel.usage] send/recv mismatch in message #2 from rank 0 to rank 1: rank 0 sends 4 float32 elements (send), "
         "rank 1 expects 4 int32 elements (recv)" +
         tail +
         "\n"
         "  usage_error: [accel.usage] send/recv mismatch in message #3 from rank 0 to rank 1: rank 0 sends an object of type int (36 "
         "encoded bytes, send_object), rank 1 expects 4 float32 elements (recv)" +
         tail + "\n";
}

}  // namespace accel_test
