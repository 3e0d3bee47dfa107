// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel version` (also `accel --version`): prints accel's version.
#pragma once

#include <cstdio>
#include <span>
#include <string>

#include <accel/runtime/version.hpp>

#include "args.hpp"

namespace accel_cli {

inline constexpr const char* version_usage = R"(usage: accel version

Prints accel's version (the same as `accel --version`).)";

/// @brief `accel version`; returns 0.
inline int run_version(std::span<char*> args) {
  if (parse_args(args, {}).help()) {
    std::fputs(format_help(version_usage, {}).c_str(), stdout);
    return 0;
  }
  std::printf("accel %s\n", accel::version_string);
  return 0;
}

}  // namespace accel_cli
