// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file processes.hpp
/// @brief The ranks of a multi-process test, started directly: each with its own environment
/// additions, output captured to files, exit codes collected with a bound that catches hangs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "files.hpp"
#include "spawn.hpp"

extern "C" char** environ;

namespace accel_test {

using Env = std::map<std::string, std::string>;

/// @brief A TCP port on loopback that nobody listens on right now (the kernel's pick for port 0),
///        and that this test program has not handed out before (two jobs started one after the
///        other bind their ports later, so the kernel could offer the first one's port again).
inline int free_port() {
  static std::set<int> handed_out;
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    ::close(fd);
    REQUIRE(ok);
    if (handed_out.insert(ntohs(a.sin_port)).second) return ntohs(a.sin_port);
  }
}

/// @brief Starts one process per argv with its own environment additions (the test's own ACCEL_*,
/// RANK and WORLD_SIZE are dropped); collects exit codes and output.
struct Processes {
  ScratchDir dir{"processes"};
  std::vector<pid_t> pids;
  std::vector<std::optional<int>> codes;

  void start(const std::vector<std::string>& argv, const Env& extra) {
    const std::size_t i = pids.size();
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('='));
      if (!extra.count(name) && name.rfind("ACCEL_", 0) != 0 && name != "RANK" && name != "WORLD_SIZE") envs.push_back(entry);
    }
    for (const auto& [k, v] : extra) envs.push_back(k + "=" + v);
    const pid_t pid = spawn_redirected(argv, std::move(envs), "/dev/null", out_file(i), err_file(i));
    REQUIRE(pid > 0);
    pids.push_back(pid);
    codes.emplace_back();
  }
  std::string out_file(std::size_t i) const { return dir.path + "/" + std::to_string(i) + ".out"; }
  std::string err_file(std::size_t i) const { return dir.path + "/" + std::to_string(i) + ".err"; }
  std::string out(std::size_t i) const { return read_file(out_file(i)); }
  std::string err(std::size_t i) const { return read_file(err_file(i)); }

  /// @brief Exit code per process (128+signal when killed). A process still running after the
  /// limit is killed and fails the test: a hang is the bug these tests exist to catch.
  std::vector<int> wait(int limit_s = 60) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
    bool hung = false;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (codes[i]) continue;
      codes[i] = wait_or_kill(pids[i], until, std::chrono::milliseconds(0));
      hung = hung || *codes[i] == -1;
    }
    if (hung) {
      std::string all;
      for (std::size_t i = 0; i < pids.size(); ++i) all += "process " + std::to_string(i) + " stderr: " + err(i) + "\n";
      FAIL("a process did not finish within " << limit_s << " s (hung collective?)\n" << all);
    }
    std::vector<int> out;
    for (auto& c : codes) out.push_back(*c);
    return out;
  }
  Processes() = default;
  Processes(const Processes&) = delete;
  Processes& operator=(const Processes&) = delete;
  ~Processes() {
    for (std::size_t i = 0; i < pids.size(); ++i)
      if (!codes[i]) ::kill(pids[i], SIGKILL), ::waitpid(pids[i], nullptr, 0);
  }
};

}  // namespace accel_test
