// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// A rank that leaves before its first collective (returns 0 or 3, _exits, is SIGKILLed, or never
// starts) must make every other rank's pending collective fail within seconds, naming it, under
// every launcher: started directly with torchrun's variables (rank 0 hosts the store), and under the
// real `accel launch`, Open MPI's mpirun, MPICH's mpiexec, SLURM's srun and torchrun (those not
// installed are skipped). The collective timeout is 300 s (30 s under the real launchers), so the
// wait bound of 20 s tells a detected failure from a hang (a bound on a hang, not a performance
// claim). A clean job whose ranks leave right after the last collective still succeeds.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/launchers.hpp"
#include "support/processes.hpp"

using accel_test::contains;
using accel_test::Env;
using accel_test::Processes;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/early_exit";
constexpr int hang_bound_s = 20;

Env common_env() { return {{"ACCEL_USE_CPU", "1"}, {"ACCEL_TIMEOUT_S", "300"}}; }

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

// The join timeout for a job whose rank 1 leaves `how`: 2 s where rank 1 never starts, so that
// the test is quick; otherwise the default 60 s, so a loaded machine that starts a survivor late
// does not turn its departure into "never joined".
std::string join_timeout_s(const std::string& how) { return how == "never" ? "2" : "60"; }

// Under a real launcher (its own environment: ACCEL_TIMEOUT_S=30, above the 20 s bound): for each
// way rank 1 leaves, the job ends within the bound and fails, and its output names rank 1 as the
// others saw it. A launcher that ends the job on a non-zero exit or a signal may stop the others
// before they print; then the launcher's own report must name rank 1's end: all of `blame(how)`.
// Then a clean job whose rank 1 leaves right after the last collective succeeds.
void check_real_launcher(const accel_test::RealLauncher& launcher,
                         const std::function<std::vector<std::string>(const std::string&)>& blame,
                         const std::vector<std::string>& only = {}) {
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  for (const auto& s : scenarios) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.how) == only.end()) continue;
    accel_test::ScratchDir dir("liveness");
    auto argv = launcher.job();
    argv.insert(argv.end(), {child, "1", s.how, "300", join_timeout_s(s.how)});
    const auto job = accel_test::run_job(argv, dir, std::chrono::seconds(hang_bound_s));
    const std::string said = job.err + job.out;  // Hydra and torchrun report on stdout
    INFO(launcher.name << ", rank 1 " << s.how << "; output:\n" << said);
    REQUIRE(job.code != -1);  // -1: still running at the bound, a hang
    REQUIRE(job.code != 0);
    const auto needles = blame(s.how);
    bool launcher_said_it = !needles.empty();
    for (const auto& needle : needles) launcher_said_it = launcher_said_it && said.find(needle) != std::string::npos;
    REQUIRE((said.find(s.message) != std::string::npos || launcher_said_it));
  }
  accel_test::ScratchDir dir("liveness");
  auto argv = launcher.job();
  argv.insert(argv.end(), {child, "1", "last", "500"});
  const auto job = accel_test::run_job(argv, dir, std::chrono::seconds(hang_bound_s));
  INFO(launcher.name << " clean job; output:\n" << job.err << job.out);
  REQUIRE(job.code == 0);
}

std::vector<std::string> no_blame(const std::string&) { return {}; }

}  // namespace

TEST_CASE("a rank that leaves before its first collective fails the others' collective within seconds, naming it", "[liveness][mp]") {
  for (const auto& s : scenarios) {
    Processes p;
    start_direct(p, {"1", s.how}, {{"ACCEL_JOIN_TIMEOUT_S", join_timeout_s(s.how)}});
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
  // The launcher hosts the store and reads the join timeout itself: `env` hands it over.
  const accel_test::RealLauncher launch{
      "accel launch", {"/usr/bin/env", "ACCEL_JOIN_TIMEOUT_S=2", ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "3"}, ""};
  // accel launch itself blames a non-zero exit or a signal at once (and stops the others).
  check_real_launcher(launch, [](const std::string& how) {
    if (how == "exit3" || how == "_exit3") return std::vector<std::string>{"rank 1 (local rank 1, pid", "exited with code 3"};
    if (how == "kill") return std::vector<std::string>{"rank 1 (local rank 1, pid", "was killed by signal 9"};
    return std::vector<std::string>{};
  });
}

TEST_CASE("under Open MPI's mpirun a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  check_real_launcher(accel_test::open_mpi_launcher(3), [](const std::string& how) {
    return how == "kill" ? std::vector<std::string>{"process rank 1 with PID", "exited on signal 9"} : std::vector<std::string>{};
  });
}

TEST_CASE("under MPICH's mpiexec a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  // Hydra names the pid, not the rank, of a process a signal killed.
  check_real_launcher(accel_test::mpich_launcher(3), [](const std::string& how) {
    return how == "kill" ? std::vector<std::string>{"BAD TERMINATION", "Killed (signal 9)"} : std::vector<std::string>{};
  });
}

TEST_CASE("under SLURM's srun a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  check_real_launcher(accel_test::slurm_launcher(3), no_blame);
}

TEST_CASE("under torchrun a rank that leaves early fails the job within seconds, naming it", "[liveness][mp][launchers]") {
  // torchrun takes seconds to start each job: the ways of leaving that differ most.
  check_real_launcher(accel_test::torchrun_launcher(3), no_blame, {"exit0", "kill", "never"});
}

namespace {

/// The pid the victim printed for the child it forked ("child <pid>"), or -1.
pid_t forked_child(const std::string& out) {
  const auto at = out.find("child ");
  return at == std::string::npos ? -1 : static_cast<pid_t>(std::atol(out.c_str() + at + 6));
}

/// Kills the victim's forked child if it is still our sleeping copy of early_exit.
void kill_forked_child(pid_t pid) {
  if (pid > 0 && accel_test::read_file("/proc/" + std::to_string(pid) + "/cmdline").find("early_exit") != std::string::npos)
    ::kill(pid, SIGKILL);
}

}  // namespace

TEST_CASE("a child forked without exec does not keep a dead rank's membership alive", "[liveness][mp][fork]") {
  // The victim forks a child that sleeps 30 s without exec, so it holds copies of the victim's
  // descriptors, then the victim is killed. Unless the store socket is closed in the child, the
  // store sees nothing until the child ends, and the others wait far beyond the bound.
  SECTION("rank 1: the others hear it lost its connection") {
    Processes p;
    start_direct(p, {"1", "fork-kill"});
    const auto codes = p.wait(hang_bound_s);
    kill_forked_child(forked_child(p.out(1)));
    INFO("rank 0 stderr: " << p.err(0) << "\nrank 2 stderr: " << p.err(2));
    REQUIRE(forked_child(p.out(1)) > 0);
    for (std::size_t r : {0u, 2u}) {
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains("rank 1 lost its connection to the store without saying goodbye"));
    }
  }
  SECTION("rank 0, which hosts the store: the others hear the store is gone") {
    Processes p;
    start_direct(p, {"0", "fork-kill"});
    const auto codes = p.wait(hang_bound_s);
    kill_forked_child(forked_child(p.out(0)));
    INFO("rank 1 stderr: " << p.err(1) << "\nrank 2 stderr: " << p.err(2));
    REQUIRE(forked_child(p.out(0)) > 0);
    for (std::size_t r : {1u, 2u}) {
      REQUIRE(codes[r] == 2);
      REQUIRE_THAT(p.err(r), contains("rank 0, which hosts it, exited or crashed"));
    }
  }
}
