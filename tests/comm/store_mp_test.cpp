// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Two jobs started at the same moment on this machine by a real launcher (Open MPI's mpirun,
// MPICH's mpiexec, SLURM's srun), neither given a MASTER_PORT: each job's store must serve its own
// ranks only, so each job gathers exactly its own results. A launcher that is not installed (or a
// SLURM without a reachable controller) is reported with WARN("test skipped: ...") and its case
// checks nothing; ctest lists such a case as skipped.
#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/run_command.hpp"
#include "support/spawn.hpp"

extern "C" char** environ;

using namespace std::chrono_literals;

namespace {

const std::string child = std::string(ACCEL_TEST_CHILD_DIR) + "/collectives_child";

// The first of `names` found as an executable on PATH.
std::optional<std::string> find_program(std::initializer_list<const char*> names) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  for (const char* name : names) {
    std::size_t pos = 0;
    while (pos <= dirs.size()) {
      const auto end = std::min(dirs.find(':', pos), dirs.size());
      const std::string full = (end == pos ? std::string(".") : dirs.substr(pos, end - pos)) + "/" + name;
      if (::access(full.c_str(), X_OK) == 0) return full;
      pos = end + 1;
    }
  }
  return std::nullopt;
}

// The test's environment without anything that would tell the children where to meet, so only
// the launcher's own variables decide.
std::vector<std::string> launcher_environment() {
  static const char* const dropped[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool drop = name.rfind("ACCEL_", 0) == 0 || name.rfind("TORCHELASTIC_", 0) == 0;
    for (const char* d : dropped) drop = drop || name == d;
    if (!drop) out.push_back(entry);
  }
  out.insert(out.end(), {"ACCEL_USE_CPU=1", "ACCEL_TIMEOUT_S=30", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
  return out;
}

// What rank 0 of a 2-rank "gather <label>" job prints: 6 prompts by rank 0, 5 by rank 1.
std::string expected_output(const std::string& label) {
  std::string s = "backend cpu, 11 results\n";
  for (int p = 0; p < 11; ++p)
    s += std::to_string(p) + ": prompt " + std::to_string(p) + " by rank " + (p < 6 ? "0" : "1") + " (" + label + ")\n";
  return s;
}

// A scratch directory for the jobs' output. Strings are appended piece by piece: GCC 12 reports a
// false -Warray-bounds on `std::string(...) + "/" + ...` here (as run_command.hpp notes).
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl;
    tmpl.append(ACCEL_TEST_BINARY_DIR).append("/store_mp_XXXXXX");
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const {
    std::string s;
    s.append(path).append("/").append(name);
    return s;
  }
};

struct Job {
  std::string label;
  pid_t pid = -1;
  std::optional<int> code;
};

// Starts one job per label at once with `launcher` (argv before the program), waits for all, and
// checks each finished with exit code 0 and printed exactly its own results.
void run_concurrent_jobs(const std::vector<std::string>& launcher, const std::vector<std::string>& labels) {
  TempDir dir;
  std::vector<Job> jobs;
  for (const auto& label : labels) {
    std::vector<std::string> argv = launcher;
    argv.insert(argv.end(), {child, "gather", label, "2000"});
    Job j{label, -1, std::nullopt};
    j.pid = accel_test::spawn_redirected(argv, launcher_environment(), "/dev/null", dir / (label + ".out"), dir / (label + ".err"));
    REQUIRE(j.pid > 0);
    jobs.push_back(j);
  }
  const auto until = std::chrono::steady_clock::now() + 120s;
  for (auto& j : jobs) {
    while (!j.code) {
      int st = 0;
      if (::waitpid(j.pid, &st, WNOHANG) == j.pid) {
        j.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      } else if (std::chrono::steady_clock::now() > until) {
        // SIGTERM first: the launcher then takes its ranks down with it.
        ::kill(j.pid, SIGTERM);
        std::this_thread::sleep_for(3s);
        ::kill(j.pid, SIGKILL);
        ::waitpid(j.pid, &st, 0);
        j.code = -1;
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
  }
  for (const auto& j : jobs) {
    INFO("job " << j.label << " (" << launcher.front() << ") stderr:\n" << accel_test::read_file(dir / (j.label + ".err")));
    CHECK(j.code == 0);
    CHECK(accel_test::read_file(dir / (j.label + ".out")) == expected_output(j.label));
  }
}

}  // namespace

TEST_CASE("two jobs started at once by Open MPI's mpirun each gather only their own results", "[store][mp][launchers]") {
  auto mpirun = find_program({"mpirun.openmpi", "orterun"});
  if (!mpirun) {
    if (auto generic = find_program({"mpirun"}); generic && accel_test::run_command("'" + *generic + "' --version 2>&1").output.find("Open MPI") != std::string::npos)
      mpirun = generic;
  }
  if (!mpirun) {
    WARN("test skipped: Open MPI's mpirun is not installed (Debian: openmpi-bin)");
    return;
  }
  run_concurrent_jobs({*mpirun, "--oversubscribe", "-np", "2"}, {"A", "B"});
}

TEST_CASE("two jobs started at once by MPICH's mpiexec (Hydra) each gather only their own results", "[store][mp][launchers]") {
  const auto mpiexec = find_program({"mpiexec.mpich", "mpiexec.hydra"});
  if (!mpiexec) {
    WARN("test skipped: MPICH's mpiexec.mpich / mpiexec.hydra is not installed (Debian: mpich)");
    return;
  }
  run_concurrent_jobs({*mpiexec, "-n", "2"}, {"A", "B"});
}

TEST_CASE("two job steps started at once by SLURM's srun each gather only their own results", "[store][mp][launchers]") {
  const auto srun = find_program({"srun"});
  if (!srun) {
    WARN("test skipped: SLURM's srun is not installed (Debian: slurm-client)");
    return;
  }
  const auto ping = accel_test::run_command("timeout 10 scontrol ping 2>&1");
  if (ping.status != 0 || ping.output.find("is UP") == std::string::npos) {
    WARN("test skipped: srun is installed but no SLURM controller answers (scontrol ping: " << ping.output.substr(0, ping.output.find('\n')) << ")");
    return;
  }
  // --overcommit: two 2-task steps at once also fit a 1-CPU node; --immediate: fail instead of queueing.
  run_concurrent_jobs({*srun, "-n", "2", "--overcommit", "--immediate=60"}, {"A", "B"});
}
