// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Point-to-point messages between real processes (tests/multiprocess/children/p2p_child.cpp):
// under the real `accel launch`, through shared memory and (ACCEL_CPU_SHM=0) through the store; a
// rank killed while its peer waits, started directly with torchrun's variables so the survivor
// reports (accel launch would stop it first), and under accel launch, which must fail the job and
// leave nothing running.
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <accel/comm/detail/shm.hpp>

#include "support/catch.hpp"
#include "support/launchers.hpp"
#include "support/p2p_expected.hpp"
#include "support/processes.hpp"

using accel_test::contains;
using accel_test::Env;
using accel_test::Processes;
using namespace std::chrono_literals;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/p2p_child";

// `accel launch --cpu` of `n` ranks running the child in `mode`; the launcher's exit code and output.
struct Launched {
  int code;
  std::string out, err;
};
Launched launch(int n, const std::string& mode, const Env& env = {}) {
  Processes p;
  p.start({ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", std::to_string(n), "--timeout", "60", child, mode}, env);
  const auto codes = p.wait(90);
  return {codes[0], p.out(0), p.err(0)};
}

const Env shm_on = {};
const Env shm_off = {{"ACCEL_CPU_SHM", "0"}};

// Whether some process's command line holds `needle`.
bool running_with(const std::string& needle) {
  DIR* d = ::opendir("/proc");
  if (!d) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos) found = true;
  }
  ::closedir(d);
  return found;
}

}  // namespace

TEST_CASE("accel launch: a ring of point-to-point sends, through shared memory and through the store", "[p2p][mp]") {
  for (const Env& env : {shm_on, shm_off}) {
    INFO("ACCEL_CPU_SHM=" << (env.empty() ? "1" : "0"));
    const auto r = launch(3, "ring", env);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    REQUIRE(r.out == "rank 0 got 'hello from rank 2'\nrank 1 got 'hello from rank 0'\nrank 2 got 'hello from rank 1'\n");
  }
}

TEST_CASE("accel launch: ping-pong of every payload kind, a 64 MiB buffer included, in order", "[p2p][mp]") {
  for (const Env& env : {shm_on, shm_off}) {
    INFO("ACCEL_CPU_SHM=" << (env.empty() ? "1" : "0"));
    const auto r = launch(2, "pingpong", env);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    REQUIRE(r.out == "rank 0 exchanged every kind\nrank 1 exchanged every kind\n");
  }
}

TEST_CASE("accel launch: a size or type mismatch fails both ends naming both ranks", "[p2p][mp]") {
  for (const Env& env : {shm_on, shm_off}) {
    INFO("ACCEL_CPU_SHM=" << (env.empty() ? "1" : "0"));
    const auto r = launch(2, "mismatch", env);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    REQUIRE(r.out == accel_test::p2p_mismatch_lines(0) + accel_test::p2p_mismatch_lines(1));
  }
}

TEST_CASE("accel launch: sending to oneself or to a rank outside the job is a usage error", "[p2p][mp]") {
  const auto r = launch(2, "self");
  INFO("stderr: " << r.err);
  REQUIRE(r.code == 0);
  REQUIRE(r.out ==
          "rank 0:\n"
          "  usage_error: [accel.usage] send: rank 0 cannot send to itself; pass another rank of this 2-rank communicator\n"
          "  usage_error: [accel.usage] recv: 2 is not a rank of this 2-rank communicator (ranks 0 to 1)\n"
          "rank 1:\n"
          "  usage_error: [accel.usage] send: rank 1 cannot send to itself; pass another rank of this 2-rank communicator\n"
          "  usage_error: [accel.usage] recv: 2 is not a rank of this 2-rank communicator (ranks 0 to 1)\n");
}

TEST_CASE("accel launch: point-to-point inside the groups of a 2 x 2 grid uses group ranks", "[p2p][mp][groups]") {
  for (const Env& env : {shm_on, shm_off}) {
    INFO("ACCEL_CPU_SHM=" << (env.empty() ? "1" : "0"));
    const auto r = launch(4, "grid", env);
    INFO("stderr: " << r.err);
    REQUIRE(r.code == 0);
    std::string want;
    for (int rank = 0; rank < 4; ++rank) {
      const int replica = rank / 2, stage = rank % 2;
      want += "rank " + std::to_string(rank) + " replica " + std::to_string(replica) + " stage " + std::to_string(stage) +
              ": usage_error: [accel.usage] send/recv mismatch in message #2 from group rank 0 (job rank " + std::to_string(stage) +
              ") to group rank 1 (job rank " + std::to_string(2 + stage) + "): group rank 0 (job rank " + std::to_string(stage) +
              ") sends 3 float32 elements (send), group rank 1 (job rank " + std::to_string(2 + stage) +
              ") expects 4 float32 elements (recv); both ends must pass the same element type and length (send/recv), or the same "
              "type (send_object/recv_object)\n";
    }
    REQUIRE(r.out == want);
  }
}

TEST_CASE("a rank killed while its peer waits in recv or send is named by the peer within 5 s", "[p2p][mp]") {
  for (const char* shm : {"1", "0"})
    for (const char* where : {"recv", "send"}) {
      INFO("ACCEL_CPU_SHM=" << shm << ", rank 0 waits in " << where);
      Processes p;
      const int port = accel_test::free_port();
      // A 300 s timeout: only noticing the death ends this within the wait limit.
      for (int r = 0; r < 2; ++r)
        p.start({child, "kill", where},
                {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "2"},
                 {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"ACCEL_TIMEOUT_S", "300"},
                 {"ACCEL_USE_CPU", "1"}, {"ACCEL_CPU_SHM", shm}});
      const auto codes = p.wait(60);
      INFO("rank 0 stderr: " << p.err(0));
      REQUIRE(codes[1] == 128 + 9);
      REQUIRE(codes[0] == 2);
      const std::string said = p.err(0);
      REQUIRE_THAT(said, contains("rank 1 "));
      REQUIRE_THAT(said, contains("lost its connection to the store without saying goodbye"));
      REQUIRE_THAT(said, contains(std::string("during message #1 from ") + (std::string(where) == "recv" ? "rank 1 to rank 0" : "rank 0 to rank 1")));
      // "rank 0 after N ms": rank 1 died 500 ms into the wait.
      const auto at = said.find("rank 0 after ");
      REQUIRE(at != std::string::npos);
      REQUIRE(std::stol(said.substr(at + 13)) < 5000);
    }
}

TEST_CASE("accel launch: a rank killed while its peer waits fails the job and leaves nothing running", "[p2p][mp]") {
  for (const char* where : {"recv", "send"}) {
    INFO("rank 0 waits in " << where);
    // A marker in every rank's command line, to look for leftovers.
    const std::string marker = "p2p-kill-" + std::to_string(::getpid());
    Processes p;
    const auto start = std::chrono::steady_clock::now();
    p.start({ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "2", "--timeout", "300", child, "kill", where, marker}, {});
    const auto codes = p.wait(60);
    INFO("stderr: " << p.err(0));
    REQUIRE(std::chrono::steady_clock::now() - start < 20s);
    REQUIRE(codes[0] != 0);
    REQUIRE_THAT(p.err(0), contains("rank 1"));
    REQUIRE_FALSE(running_with(marker));
    // Nothing left in /dev/shm by either rank: the survivor unlinked its segments and channels, the
    // launcher the killed rank's.
    std::vector<int> pids;
    std::istringstream out(p.out(0));
    for (std::string word; out >> word;)
      if (word == "pid") pids.push_back(0), out >> pids.back();
    REQUIRE(pids.size() == 2);
    for (const int pid : pids) {
      const std::string prefix = "accel." + std::to_string(accel::detail::pid_namespace_id()) + "." + std::to_string(pid) + ".";
      std::vector<std::string> left;
      for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
        if (e.path().filename().string().rfind(prefix, 0) == 0) left.push_back(e.path().filename().string());
      INFO("pid " << pid);
      CHECK(left.empty());
    }
  }
}
