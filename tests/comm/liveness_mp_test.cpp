// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// A rank that leaves before its first collective (returns 0 or 3, _exits, is SIGKILLed, or never
// starts) must make every other rank's pending collective fail within seconds, naming it, under
// every launcher: started directly with torchrun's variables (rank 0 hosts the store), under the
// real `accel launch`, Open MPI's mpirun and MPICH's mpiexec. The collective timeout is 300 s in
// every job, so the wait bound of 20 s tells a detected failure from a hang (it is a bound on a
// hang, not a performance claim). A clean job whose ranks leave right after the last collective
// still succeeds.
#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/launchers.hpp"
#include "support/processes.hpp"
#include "support/run_command.hpp"

using accel_test::contains;
using accel_test::Env;
using accel_test::Processes;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/early_exit";
constexpr int hang_bound_s = 20;

Env common_env() {
  return {{"ACCEL_USE_CPU", "1"}, {"ACCEL_TIMEOUT_S", "300"}, {"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}};
}

// A 3-rank job in torchrun style: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
void start_direct(Processes& p, const std::vector<std::string>& args, const Env& more = {}) {
  const int port = accel_test::free_port();
  for (int r = 0; r < 3; ++r) {
    Env env = common_env();
    env.insert({{"RANK", std::to_string(r)}, {"WORLD_SIZE", "3"}, {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "3"},
                {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}});
    for (const auto& [k, v] : more) env[k] = v;
    std::vector<std::string> argv = {child};
    argv.insert(argv.end(), args.begin(), args.end());
    p.start(argv, env);
  }
}

// A job started by `launcher` (argv before the program) with 3 ranks; one process to wait for.
void start_launched(Processes& p, std::vector<std::string> launcher, const std::vector<std::string>& args, const Env& more = {}) {
  launcher.push_back(child);
  launcher.insert(launcher.end(), args.begin(), args.end());
  Env env = common_env();
  for (const auto& [k, v] : more) env[k] = v;
  p.start(launcher, env);
}

struct Scenario {
  const char* how;
  const char* message;  // what the surviving ranks say about rank 1
};

// What the others report for each way rank 1 leaves.
const Scenario scenarios[] = {
    {"exit0", "rank 1 exited without joining communicator setup (default)"},
    {"exit3", "rank 1 exited without joining communicator setup (default)"},
    {"_exit3", "rank 1 lost its connection to the store without saying goodbye (the process crashed, was killed, or ended without "
               "destroying its DistributedState), so it cannot join communicator setup (default)"},
    {"kill", "rank 1 lost its connection to the store without saying goodbye"},
    {"never", "rank 1 never joined the job: it did not connect to the store within 2 s (ACCEL_JOIN_TIMEOUT_S)"},
};

std::optional<std::string> open_mpi_mpirun() {
  if (auto m = accel_test::find_program({"mpirun.openmpi", "orterun"})) return m;
  auto generic = accel_test::find_program({"mpirun"});
  if (generic && accel_test::run_command("'" + *generic + "' --version 2>&1").output.find("Open MPI") != std::string::npos) return generic;
  return std::nullopt;
}

// Under a real launcher: the job ends within the bound, fails, and its output names rank 1 as the
// others saw it. A launcher that ends the job on a non-zero exit or a signal may stop the others
// before they print; then the launcher's own report must name rank 1's end: every one of `blame`.
void check_launched(const std::vector<std::string>& launcher, const Scenario& s, const std::vector<std::string>& blame) {
  Processes p;
  start_launched(p, launcher, {"1", s.how}, {{"ACCEL_JOIN_TIMEOUT_S", "2"}});
  const auto codes = p.wait(hang_bound_s);
  const std::string err = p.err(0) + p.out(0);  // Hydra reports on stdout
  INFO("launcher " << launcher.front() << ", rank 1 " << s.how << "; output:\n" << err);
  REQUIRE(codes[0] != 0);
  bool launcher_said_it = !blame.empty();
  for (const auto& needle : blame) launcher_said_it = launcher_said_it && err.find(needle) != std::string::npos;
  REQUIRE((err.find(s.message) != std::string::npos || launcher_said_it));
}

}  // namespace

TEST_CASE("a rank that leaves before its first collective fails the others' collective within seconds, naming it", "[liveness][mp]") {
  for (const auto& s : scenarios) {
    Processes p;
    start_direct(p, {"1", s.how}, {{"ACCEL_JOIN_TIMEOUT_S", "2"}});
    const auto codes = p.wait(hang_bound_s);
    INFO("rank 1 " << s.how << "; rank 0 stderr: " << p.err(0) << "\nrank 2 stderr: " << p.err(2));
    for (std::size_t r : {0u, 2u}) {
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains(s.message));
    }
    REQUIRE(p.out(1).rfind("left ", 0) == 0);
  }
}

TEST_CASE("when rank 0, which hosts the store, leaves or never starts, the others say so within seconds", "[liveness][mp]") {
  SECTION("killed") {
    Processes p;
    start_direct(p, {"0", "kill"});
    const auto codes = p.wait(hang_bound_s);
    for (std::size_t r : {1u, 2u}) {
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains("lost the connection to the store at 127.0.0.1:"));
      REQUIRE_THAT(p.err(r), contains("rank 0, which hosts it, exited or crashed"));
    }
  }
  SECTION("returned 0: its store stays up for the others, which hear that it exited") {
    Processes p;
    start_direct(p, {"0", "exit0"});
    const auto codes = p.wait(hang_bound_s);
    REQUIRE(codes[0] == 0);
    for (std::size_t r : {1u, 2u}) {
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains("rank 0 exited without joining communicator setup (default)"));
    }
  }
  SECTION("never started") {
    Processes p;
    start_direct(p, {"0", "never"}, {{"ACCEL_JOIN_TIMEOUT_S", "2"}});
    const auto codes = p.wait(hang_bound_s);
    for (std::size_t r : {1u, 2u}) {
      INFO("rank " << r << " stderr: " << p.err(r));
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains("could not join the job within 2 s (ACCEL_JOIN_TIMEOUT_S): rank 0, which hosts the store, did "
                                      "not answer"));
    }
  }
}

TEST_CASE("a rank that leaves right after the last collective does not fail the others", "[liveness][mp]") {
  Processes p;
  start_direct(p, {"1", "last", "500"});
  const auto codes = p.wait(hang_bound_s);
  INFO("rank 0 stderr: " << p.err(0) << "\nrank 2 stderr: " << p.err(2));
  REQUIRE(codes == std::vector<int>{0, 0, 0});
  REQUIRE(p.out(0) == "ok\n");
}

TEST_CASE("under accel launch a rank that leaves early fails the job within seconds, naming it", "[liveness][mp]") {
  const std::vector<std::string> launch = {ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "3", "--timeout", "300"};
  for (const auto& s : scenarios) {
    const std::string how = s.how;
    // accel launch itself blames a non-zero exit or a signal at once (and stops the others).
    std::vector<std::string> blame;
    if (how == "exit3" || how == "_exit3") blame = {"rank 1 (local rank 1, pid", "exited with code 3"};
    if (how == "kill") blame = {"rank 1 (local rank 1, pid", "was killed by signal 9"};
    check_launched(launch, s, blame);
  }
  Processes p;
  start_launched(p, launch, {"1", "last", "500"});
  REQUIRE(p.wait(hang_bound_s)[0] == 0);
  REQUIRE_THAT(p.out(0), contains("ok\n"));
}

TEST_CASE("under Open MPI's mpirun a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  const auto mpirun = open_mpi_mpirun();
  if (!mpirun) {
    WARN("test skipped: Open MPI's mpirun is not installed (Debian: openmpi-bin)");
    return;
  }
  for (const auto& s : scenarios) {
    const std::string how = s.how;
    check_launched({*mpirun, "--oversubscribe", "-np", "3"}, s,
                   how == "kill" ? std::vector<std::string>{"process rank 1 with PID", "exited on signal 9"} : std::vector<std::string>{});
  }
  Processes p;
  start_launched(p, {*mpirun, "--oversubscribe", "-np", "3"}, {"1", "last", "500"});
  INFO("output: " << p.err(0));
  REQUIRE(p.wait(hang_bound_s)[0] == 0);
}

TEST_CASE("under MPICH's mpiexec a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  const auto mpiexec = accel_test::find_program({"mpiexec.mpich", "mpiexec.hydra"});
  if (!mpiexec) {
    WARN("test skipped: MPICH's mpiexec.mpich / mpiexec.hydra is not installed (Debian: mpich)");
    return;
  }
  for (const auto& s : scenarios) {
    // Hydra names the pid, not the rank, of a process a signal killed.
    const std::string how = s.how;
    check_launched({*mpiexec, "-n", "3"}, s,
                   how == "kill" ? std::vector<std::string>{"BAD TERMINATION", "Killed (signal 9)"} : std::vector<std::string>{});
  }
  Processes p;
  start_launched(p, {*mpiexec, "-n", "3"}, {"1", "last", "500"});
  INFO("output: " << p.err(0));
  REQUIRE(p.wait(hang_bound_s)[0] == 0);
}
