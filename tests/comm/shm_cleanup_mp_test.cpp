// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Shared-memory segments left by killed processes: remove_shm_segments_of() removes those of the
// given processes once they are gone, and `accel launch` calls it when a job ends.
#include <accel/comm/shm_cleanup.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/processes.hpp"

namespace {

// "accel.<pid namespace>.<pid>." — appended piece by piece: GCC 12 reports a false -Warray-bounds on
// `std::string(...) + "." + ...` chains (as support/run_command.hpp notes).
std::string segment_prefix(pid_t pid) {
  std::string s;
  s.append("accel.").append(std::to_string(accel::detail::pid_namespace_id())).append(".").append(std::to_string(pid)).append(".");
  return s;
}

// Names in /dev/shm of segments created by process `pid` (this PID namespace).
std::vector<std::string> segments_of(pid_t pid) {
  const std::string prefix = segment_prefix(pid);
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

void make_segment(pid_t owner, const std::string& tail) {
  std::string name = "/";
  name.append(segment_prefix(owner)).append(tail);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
}

pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

}  // namespace

TEST_CASE("remove_shm_segments_of removes the segments of the given processes that are gone, and only those", "[shm]") {
  if (::access("/dev/shm", W_OK) != 0 || accel::detail::pid_namespace_id() == 0) {
    WARN("test skipped: no writable /dev/shm or no /proc/self/ns/pid here");
    return;
  }
  const pid_t gone = dead_pid(), other_gone = dead_pid(), alive = ::getpid();
  make_segment(gone, "7.a");
  make_segment(gone, "7.b");
  make_segment(other_gone, "1.a");
  make_segment(alive, "99.a");
  const std::vector<pid_t> job = {gone, alive};
  REQUIRE(accel::remove_shm_segments_of(job) == 2);
  CHECK(segments_of(gone).empty());
  CHECK(segments_of(other_gone).size() == 1);  // not one of the job's processes
  CHECK(segments_of(alive).size() == 1);       // alive (a reused pid looks the same)
  for (pid_t p : {other_gone, alive})
    for (const auto& n : segments_of(p)) ::shm_unlink(std::string("/").append(n).c_str());
}

TEST_CASE("accel launch removes the shared-memory segments of ranks killed before they could", "[shm][mp]") {
  if (::access("/dev/shm", W_OK) != 0 || accel::detail::pid_namespace_id() == 0) {
    WARN("test skipped: no writable /dev/shm or no /proc/self/ns/pid here");
    return;
  }
  accel_test::Processes p;
  std::string child = ACCEL_TEST_CHILD_DIR;
  child.append("/early_exit");
  p.start({ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "3", "--timeout", "300", child, "1", "shm-kill"}, {{"ACCEL_USE_CPU", "1"}});
  const auto codes = p.wait(20);
  INFO("launcher output: " << p.err(0));
  // Rank 1's SIGKILL (137), or the code 2 of a rank that heard of it through the store before the
  // launcher saw rank 1 die: either way the job failed.
  REQUIRE((codes[0] == 137 || codes[0] == 2));
  std::vector<pid_t> ranks;
  std::istringstream out(p.out(0));
  for (std::string word; out >> word;)
    if (word == "pid") {
      int pid = 0;
      out >> pid;
      ranks.push_back(pid);
    }
  REQUIRE(ranks.size() == 3);  // every rank wrote its 512 KiB through its segment before rank 1 died
  for (pid_t pid : ranks) {
    INFO("rank pid " << pid);
    CHECK(segments_of(pid).empty());
  }
  CHECK_THAT(p.err(0), accel_test::contains("shared-memory segment"));
}
