// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file run_command.hpp
/// @brief Runs a shell command in tests and captures its output and exit status.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace accel_test {

/// @brief A path single-quoted for the shell command lines the CLI tests build.
inline std::string quoted(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

struct CommandResult {
  int status = -1;     ///< exit status (128 + signal when killed)
  std::string output;  ///< stdout (and stderr when the command redirects it)
};

/// @brief Runs `command` through /bin/sh; append "2>&1" to capture stderr too.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) r.output.append(buf, n);
  const int raw = ::pclose(p);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : WIFSIGNALED(raw) ? 128 + WTERMSIG(raw) : -1;
  return r;
}

/// @brief The built `accel` command followed by `args` (a shell fragment).
inline std::string accel_cli(const std::string& args) {
  // Appended piece by piece: GCC 12 reports a false -Warray-bounds on `std::string("'") + ...`.
  std::string cmd;
  cmd.reserve(args.size() + 256);
  cmd.append(1, '\'').append(ACCEL_TEST_CLI).append("' ").append(args);
  return cmd;
}

}  // namespace accel_test
