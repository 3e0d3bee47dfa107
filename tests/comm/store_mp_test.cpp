// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Two jobs started at the same moment on this machine by a real launcher (Open MPI's mpirun,
// MPICH's mpiexec, SLURM's srun, torchrun, accel launch), neither given a MASTER_PORT: each job's store must serve its own
// ranks only, so each job gathers exactly its own results. A launcher that is not installed (or a
// SLURM without a reachable controller) is reported with WARN("test skipped: ...") and its case
// checks nothing; ctest lists such a case as skipped.
#include <chrono>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/launchers.hpp"
#include "support/processes.hpp"
#include "support/run_command.hpp"
#include "support/spawn.hpp"

using namespace std::chrono_literals;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/collectives_child";

// What rank 0 of a 2-rank "gather <label>" job prints: 6 prompts by rank 0, 5 by rank 1.
std::string expected_output(const std::string& label) {
  std::string s = "backend cpu, 11 results\n";
  for (int p = 0; p < 11; ++p)
    s += std::to_string(p) + ": prompt " + std::to_string(p) + " by rank " + (p < 6 ? "0" : "1") + " (" + label + ")\n";
  return s;
}

struct Job {
  std::string label;
  pid_t pid = -1;
  int code = -1;
};

// What a launcher that prefixes every line of rank 0 with `prefix` (torchrun's "[default0]:")
// shows of rank 0's output: those lines, without the prefix.
std::string lines_with_prefix(const std::string& text, const std::string& prefix) {
  if (prefix.empty()) return text;
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (line.rfind(prefix, 0) == 0) out += line.substr(prefix.size()) + "\n";
    at = end == std::string::npos ? text.size() : end + 1;
  }
  return out;
}

// Starts two jobs, A and B, at once with `launcher` (its job() before the program), waits for both,
// and checks each finished with exit code 0 and printed exactly its own results (the lines rank 0
// printed, after `prefix` when the launcher prefixes them).
void run_concurrent_jobs(const accel_test::RealLauncher& launcher, const std::string& prefix = "") {
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("store_mp");
  std::vector<Job> jobs;
  for (const std::string label : {"A", "B"}) {
    std::vector<std::string> argv = launcher.job();
    argv.insert(argv.end(), {child, "gather", label, "2000"});
    Job j{label, -1, -1};
    j.pid = accel_test::spawn_redirected(argv, accel_test::launcher_environment(dir / ("launcher-" + label)), "/dev/null",
                                         dir / (label + ".out"), dir / (label + ".err"));
    REQUIRE(j.pid > 0);
    jobs.push_back(j);
  }
  const auto until = std::chrono::steady_clock::now() + 90s;  // before ctest's 120 s, so the output is shown
  for (auto& j : jobs) j.code = accel_test::wait_or_kill(j.pid, until, 3s);
  for (const auto& j : jobs) {
    INFO("job " << j.label << " (" << launcher.name << ") stderr:\n" << accel_test::read_file(dir / (j.label + ".err")));
    CHECK(j.code == 0);
    CHECK(lines_with_prefix(accel_test::read_file(dir / (j.label + ".out")), prefix) == expected_output(j.label));
  }
}

}  // namespace

TEST_CASE("two jobs started at once by Open MPI's mpirun each gather only their own results", "[store][mp][launchers]") {
  run_concurrent_jobs(accel_test::open_mpi_launcher(2));
}

TEST_CASE("two jobs started at once by MPICH's mpiexec (Hydra) each gather only their own results", "[store][mp][launchers]") {
  run_concurrent_jobs(accel_test::mpich_launcher(2));
}

TEST_CASE("two job steps started at once by SLURM's srun each gather only their own results", "[store][mp][launchers]") {
  run_concurrent_jobs(accel_test::slurm_launcher(2));
}

TEST_CASE("two jobs started at once by torchrun each gather only their own results", "[store][mp][launchers]") {
  run_concurrent_jobs(accel_test::torchrun_launcher(2), "[default0]:");
}

TEST_CASE("two jobs started at once by accel launch each gather only their own results", "[store][mp]") {
  run_concurrent_jobs({"accel launch", {ACCEL_TEST_CLI, "launch", "--cpu", "--num_processes", "2"}, ""});
}

TEST_CASE("a process of another job that meets a running job at its MASTER_PORT is refused, naming the rank's holder", "[store][mp]") {
  // Jobs started by hand (torchrun's variables, no launcher) carry no job identity: two given one
  // MASTER_PORT meet at one store. Job A waits in a collective for 3 s (its rank 1 pauses); a
  // process of job B that claims rank 2 is refused, or, where it reached the store first, job A's
  // own rank 2 is: either way the two never run one collective together.
  const std::string early_exit = std::string(ACCEL_TEST_CHILD_DIR) + "/early_exit";
  const int port = accel_test::free_port();
  const auto env = [&](int rank) {
    return accel_test::Env{{"ACCEL_USE_CPU", "1"}, {"ACCEL_TIMEOUT_S", "60"}, {"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
                           {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", "3"}, {"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", std::to_string(port)}};
  };
  accel_test::Processes p;
  for (int r = 0; r < 3; ++r) p.start({early_exit, "1", "exit0", "3000"}, env(r));
  std::this_thread::sleep_for(500ms);
  p.start({early_exit, "1", "exit0", "3000"}, env(2));  // job B's rank 2
  const auto codes = p.wait(30);
  const std::string taken = "rank 2 is already taken in this job by another process (127.0.0.1:";
  INFO("job A rank 2: " << p.err(2) << "\njob B rank 2: " << p.err(3));
  const bool a_refused = p.err(2).find(taken) != std::string::npos, b_refused = p.err(3).find(taken) != std::string::npos;
  REQUIRE(a_refused != b_refused);
  REQUIRE(codes[a_refused ? 2 : 3] == 2);
  REQUIRE_THAT(p.err(a_refused ? 2 : 3), accel_test::contains("two jobs share this store's address (give each job its own MASTER_PORT"));
}
