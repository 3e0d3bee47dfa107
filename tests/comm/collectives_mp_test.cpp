// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Collectives between real processes: gather order, a rank that throws, a rank that dies, a
// collective on only the main process, a wrong job token. Most jobs are started here directly with
// torchrun's variables (so no supervisor kills the survivors before they report), some with a
// store hosted by the test as accel launch hosts it, one through the real `accel launch`.
#include <accel/comm/store.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/processes.hpp"

extern "C" char** environ;

using accel_test::contains;
using namespace std::chrono_literals;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/collectives_child";

using accel_test::read_file;

using accel_test::Env;
using accel_test::free_port;
using accel_test::Processes;

Env rank_env(int rank, int world, int port, int timeout_s) {
  return {{"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},  {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},          {"MASTER_PORT", std::to_string(port)},
          {"ACCEL_TIMEOUT_S", std::to_string(timeout_s)}, {"ACCEL_USE_CPU", "1"}};
}

// A job of `n` ranks in torchrun style: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
void start_job(Processes& p, int n, const std::vector<std::string>& args, int timeout_s = 60, const Env& more = {}) {
  const int port = free_port();
  for (int r = 0; r < n; ++r) {
    Env env = rank_env(r, n, port, timeout_s);
    for (const auto& [k, v] : more) env[k] = v;
    std::vector<std::string> argv = {child};
    argv.insert(argv.end(), args.begin(), args.end());
    p.start(argv, env);
  }
}

std::string expected_gather_output(int n) {
  std::string s = "backend cpu, 11 results\n";
  // 11 prompts over n ranks: the first 11 % n ranks get one more (accelerate's split).
  const int q = 11 / n, rem = 11 % n;
  int prompt = 0;
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < q + (r < rem ? 1 : 0); ++k, ++prompt)
      s += std::to_string(prompt) + ": prompt " + std::to_string(prompt) + " by rank " + std::to_string(r) + "\n";
  return s;
}

}  // namespace

TEST_CASE("processes gather every result in input order on the main process", "[collectives][mp]") {
  for (int n : {2, 3, 4}) {
    Processes p;
    start_job(p, n, {"gather"});
    const auto codes = p.wait();
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " stderr: " << p.err(static_cast<std::size_t>(r)));
      REQUIRE(codes[static_cast<std::size_t>(r)] == 0);
    }
    REQUIRE(p.out(0) == expected_gather_output(n));
    REQUIRE(p.out(1).empty());  // print() is main-process only
  }
}

TEST_CASE("processes gather through a store hosted outside the job, as accel launch hosts it", "[collectives][mp]") {
  accel::StoreServerOptions o;
  o.log = [](const std::string&) {};
  accel::StoreServer store("127.0.0.1", 0, "0123456789abcdef", o);
  Processes p;
  start_job(p, 3, {"gather"}, 60, {{"ACCEL_STORE", store.address()}, {"ACCEL_JOB_TOKEN", "0123456789abcdef"}, {"MASTER_PORT", "1"}});
  const auto codes = p.wait();
  for (int r = 0; r < 3; ++r) REQUIRE(codes[static_cast<std::size_t>(r)] == 0);
  REQUIRE(p.out(0) == expected_gather_output(3));
}

TEST_CASE("large payloads between processes go through shared memory intact", "[collectives][mp]") {
  Processes p;
  start_job(p, 4, {"big"});
  const auto codes = p.wait();
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << " stderr: " << p.err(static_cast<std::size_t>(r)));
    REQUIRE(codes[static_cast<std::size_t>(r)] == 0);
  }
  REQUIRE(p.out(0) == "sum " + std::to_string((1ull << 20) * (1 + 2 + 3 + 4)) + "\n");
}

TEST_CASE("processes all_reduce and all_gather buffers through shared memory", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"all_reduce"});
  const auto codes = p.wait();
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << " stderr: " << p.err(static_cast<std::size_t>(r)));
    REQUIRE(codes[static_cast<std::size_t>(r)] == 0);
  }
  REQUIRE(p.out(0) == "sum 6 6 ids 0 2\n");
}

TEST_CASE("a rank that dies during a buffer collective is named by the others, not waited for", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"die-reduce"}, 300);  // a 300 s timeout: only noticing the death can end this within the wait limit
  const auto codes = p.wait(60);
  REQUIRE(codes[1] == 9);
  for (std::size_t r : {0u, 2u}) {
    INFO("rank " << r << " stderr: " << p.err(r));
    REQUIRE(codes[r] == 2);
    // Mid-transfer (the usual case) or, on a slow machine, before it joined the descriptor round.
    const std::string e = p.err(r);
    const bool named = e.find("rank 1 (pid ") != std::string::npos || e.find("rank 1 disconnected") != std::string::npos;
    REQUIRE(named);
  }
}

TEST_CASE("a rank whose value fails to serialize makes every process fail naming it", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"throw"});
  const auto codes = p.wait();
  REQUIRE(codes == std::vector<int>{2, 2, 2});
  REQUIRE_THAT(p.err(1), contains("rank 1: [accel.serialization] cannot encode a (anonymous namespace)::Fragile on rank 1: rank 1's "
                                  "result holds invalid data"));
  for (std::size_t r : {0u, 2u})
    REQUIRE_THAT(p.err(r), contains("[accel.comm] rank 1 failed before gather_object #1 and joined it with a failure marker"));
}

TEST_CASE("a rank that dies mid-collective is named by the others at once, not after the timeout", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"die"}, 300);  // a 300 s timeout: only the disconnect can end this within the wait limit
  const auto codes = p.wait(60);
  REQUIRE(codes[1] == 9);
  for (std::size_t r : {0u, 2u}) {
    REQUIRE(codes[r] == 2);
    REQUIRE_THAT(p.err(r), contains("[accel.comm] rank 1 lost its connection to the store without saying goodbye (the process "
                                    "crashed, was killed, or ended without destroying its DistributedState), so it cannot join "
                                    "gather_object #2"));
  }
}

TEST_CASE("when the rank hosting the store dies the others report the lost store", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"die", "0"}, 300);
  const auto codes = p.wait(60);
  REQUIRE(codes[0] == 9);
  for (std::size_t r : {1u, 2u}) {
    REQUIRE(codes[r] == 2);
    REQUIRE_THAT(p.err(r), contains("lost the connection to the store at 127.0.0.1:"));
    REQUIRE_THAT(p.err(r), contains("rank 0, which hosts it, exited or crashed"));
  }
}

TEST_CASE("gather_object inside if (is_main_process()) is reported on the main process instead of hanging", "[collectives][mp]") {
  Processes p;
  start_job(p, 3, {"main-only"}, 300);
  const auto codes = p.wait(60);
  REQUIRE(codes == std::vector<int>{2, 0, 0});
  REQUIRE_THAT(p.err(0), contains("exited without joining gather_object #2 (was the collective called on only some ranks"));
}

TEST_CASE("a process with the wrong job token is refused and the others time out naming it", "[collectives][mp]") {
  accel::StoreServerOptions o;
  o.log = [](const std::string&) {};
  accel::StoreServer store("127.0.0.1", 0, "right-token", o);
  Processes p;
  const int port = free_port();
  for (int r = 0; r < 3; ++r) {
    // 5 s: long enough that a loaded machine starting rank 1 late still has only rank 2 missing.
    Env env = rank_env(r, 3, port, 5);
    env["ACCEL_STORE"] = store.address();
    env["ACCEL_JOB_TOKEN"] = r == 2 ? "wrong-token" : "right-token";
    p.start({child, "gather"}, env);
  }
  const auto codes = p.wait();
  REQUIRE(codes == std::vector<int>{2, 2, 2});
  REQUIRE_THAT(p.err(2), contains("refused this process: wrong job token"));
  for (std::size_t r : {0u, 1u}) {
    REQUIRE_THAT(p.err(r), contains("[accel.comm.timeout] timed out after 5 s in communicator setup (default): rank 2 (never connected) "
                                    "has not arrived"));
  }
}

TEST_CASE("the real accel launch runs a gathering job", "[collectives][mp]") {
  Processes p;
  p.start({ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "3", "--timeout", "60", child, "gather"}, {});
  const auto codes = p.wait();
  INFO("stderr: " << p.err(0));
  REQUIRE(codes[0] == 0);
  REQUIRE(p.out(0) == expected_gather_output(3));
}

TEST_CASE("a rank that dies while its group waits is named by group rank and job rank and the other group is unaffected",
          "[collectives][mp][groups]") {
  const std::string groups_child = std::string(ACCEL_TEST_CHILD_DIR) + "/groups_child";
  Processes q;
  const int port = free_port();
  // A 300 s timeout: only noticing the death can end this within the wait limit.
  for (int r = 0; r < 4; ++r) q.start({groups_child, "die"}, rank_env(r, 4, port, 300));
  const auto codes = q.wait(60);
  REQUIRE(codes[3] == 9);
  REQUIRE(codes[0] == 0);
  REQUIRE(codes[1] == 0);
  INFO("rank 2 stderr: " << q.err(2));
  REQUIRE(codes[2] == 2);
  REQUIRE_THAT(q.err(2), contains("[accel.comm] group rank 1 (job rank 3) lost its connection to the store without saying goodbye"));
  REQUIRE_THAT(q.err(2), contains("so it cannot join gather_object #1"));
}
