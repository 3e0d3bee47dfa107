// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file processes.hpp
/// @brief The ranks of a multi-process test, started directly: each with its own environment
/// additions, output captured to files, exit codes collected with a bound that catches hangs.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <accel/runtime/env.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "files.hpp"
#include "spawn.hpp"

extern "C" char** environ;

namespace accel_test {

using Env = std::map<std::string, std::string>;

/// @brief Whether a TCP socket can bind 127.0.0.1:`port` now (nobody listens on it).
inline bool loopback_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

/// @brief A TCP port on loopback for a job's store, nobody listening on it now, and this test
///        program's own until it exits: the test programs ctest runs side by side each lock (flock)
///        a file named after the port in one shared folder, so no two of them hand out one port
///        (a job without a job identity meets whatever store listens at its MASTER_PORT). The
///        ports lie below both the kernel's ephemeral range (no outgoing connection takes one
///        between the pick and the job's bind) and accel's derived store ports.
/// @param count how many consecutive ports to claim (torchrun's store at P, accel's at P+1); the first is returned
inline int free_port(int count = 1) {
  static std::vector<int> held;  // the lock files, open (and locked) until the program exits
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  const int first = 20000, last = std::max(first + 1000, std::min(ephemeral_low, accel::job_port_first));  // [first, last)
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "accel-test-ports";
  std::error_code ignored;  // a folder another user made (and opened to all) is used as it is
  std::filesystem::create_directories(dir, ignored);
  std::filesystem::permissions(dir, std::filesystem::perms::all | std::filesystem::perms::sticky_bit, std::filesystem::perm_options::add,
                               ignored);
  const int span = last - first - (count - 1);
  const auto seed = static_cast<std::uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull ^
                    static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const int start = static_cast<int>(seed % static_cast<std::uint64_t>(span));
  for (int i = 0; i < span; ++i) {
    const int port = first + (start + i) % span;
    std::vector<int> fds;
    bool claimed = true;
    for (int p = port; claimed && p < port + count; ++p) {
      const int fd = ::open((dir / std::to_string(p)).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
      if (fd >= 0) fds.push_back(fd);
      // Not ours where another test program holds it, or where something listens there.
      claimed = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0 && loopback_port_free(p);
    }
    if (claimed) {
      held.insert(held.end(), fds.begin(), fds.end());
      return port;
    }
    for (int fd : fds) ::close(fd);
  }
  FAIL("no free loopback port in " << first << "-" << last - 1 << " (every one locked under " << dir.string() << " or in use)");
  return -1;
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
