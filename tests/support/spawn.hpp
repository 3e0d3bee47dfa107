// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file spawn.hpp
/// @brief Starts a real process for multi-process tests: given argv and environment, stdin from a
/// file, stdout and stderr into files.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace accel_test {

/// @brief posix_spawn of argv[0] with exactly `env`; stdin from `in`, stdout/stderr truncated into `out`/`err`.
/// @return the child's pid, or -1 when it could not be started
inline pid_t spawn_redirected(std::vector<std::string> argv, std::vector<std::string> env, const std::string& in,
                              const std::string& out, const std::string& err) {
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, in.c_str(), O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

/// @brief Waits for a child the test started: its exit code (128 + signal when killed), or -1 when
///        it was still running at `until`. It is then sent SIGTERM (a launcher takes its ranks down
///        with it) and SIGKILL `grace` later; with no grace, SIGKILL at once.
inline int wait_or_kill(pid_t pid, std::chrono::steady_clock::time_point until, std::chrono::milliseconds grace) {
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() > until) {
      if (grace.count() > 0) {
        ::kill(pid, SIGTERM);
        std::this_thread::sleep_for(grace);
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace accel_test
