// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file version.hpp
/// @brief The library version; CMake parses it from here, so this header is authoritative.
#pragma once

#define ACCEL_VERSION_MAJOR 0
#define ACCEL_VERSION_MINOR 1
#define ACCEL_VERSION_PATCH 0
#define ACCEL_VERSION_STRING "0.1.0"

namespace accel {
/// @brief The version as "major.minor.patch".
inline constexpr const char* version_string = ACCEL_VERSION_STRING;
}  // namespace accel
