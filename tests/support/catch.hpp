// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file catch.hpp
/// @brief Catch2 shim: the same test sources build against Catch2 2.13 and Catch2 3.x.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define ACCEL_TEST_CATCH3 1
#else
#include <catch2/catch.hpp>
#define ACCEL_TEST_CATCH3 0
#endif

#include <string>

namespace accel_test {
/// @brief Floating-point comparison (Catch::Approx in v3, ::Approx in v2).
#if ACCEL_TEST_CATCH3
using Catch::Approx;
#else
using ::Approx;
#endif

/// @brief Matcher "the string contains `needle`" (ContainsSubstring in v3, Contains in v2).
inline auto contains(const std::string& needle) {
#if ACCEL_TEST_CATCH3
  return Catch::Matchers::ContainsSubstring(needle);
#else
  return Catch::Matchers::Contains(needle);
#endif
}
}  // namespace accel_test
