// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file launchers.hpp
/// @brief The real launchers installed on this machine (Open MPI's mpirun, MPICH's mpiexec, SLURM's
///        srun, torchrun) as argv prefixes for the multi-process tests, each with the reason it
///        cannot be used here when it cannot.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <filesystem>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "files.hpp"
#include "processes.hpp"
#include "run_command.hpp"
#include "spawn.hpp"

extern "C" char** environ;

namespace accel_test {

/// @brief The first of `names` found as an executable on PATH.
inline std::optional<std::string> find_program(std::initializer_list<const char*> names) {
  const char* path = std::getenv("PATH");
  const std::string dirs = path ? path : "/usr/bin:/bin";
  for (const char* name : names) {
    std::size_t pos = 0;
    while (pos <= dirs.size()) {
      const auto end = std::min(dirs.find(':', pos), dirs.size());
      std::string full = end == pos ? std::string(".") : dirs.substr(pos, end - pos);
      full.append("/").append(name);
      if (::access(full.c_str(), X_OK) == 0) return full;
      pos = end + 1;
    }
  }
  return std::nullopt;
}

/// @brief SLURM_CONF of the private cluster the "slurm" ctest fixture started
///        (tests/support/slurm_cluster.sh), "" when there is none (then SLURM's defaults apply).
inline std::string private_slurm_conf() {
  const std::string conf = std::string(ACCEL_TEST_SLURM_DIR).append("/slurm.conf");
  return ::access(conf.c_str(), R_OK) == 0 ? conf : std::string();
}

/// @brief The test's environment without anything that would tell the children where to meet, so
///        only the launcher's own variables decide; ranks use the CPU and time out after 30 s.
/// @param scratch a folder of this job's own (created if missing) where Open MPI keeps its session
///        files: two mpiruns starting at once in one temporary folder race to create their shared
///        session folder there, and the loser fails ("A call to mkdir ... File exists")
inline std::vector<std::string> launcher_environment(const std::filesystem::path& scratch = {}) {
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
  if (const auto conf = private_slurm_conf(); !conf.empty()) {
    std::erase_if(out, [](const std::string& e) { return e.rfind("SLURM_CONF=", 0) == 0; });
    out.push_back(std::string("SLURM_CONF=").append(conf));
  }
  if (!scratch.empty()) {
    std::filesystem::create_directories(scratch);
    out.push_back("OMPI_MCA_orte_tmpdir_base=" + scratch.string());  // Open MPI 4
    out.push_back("PRTE_MCA_prte_tmpdir_base=" + scratch.string());  // Open MPI 5 (PRRTE)
  }
  return out;
}

/// @brief A real launcher: how to start `n` ranks of a program (append the program and its
///        arguments to job()), or why it cannot run here (`skip` non-empty, `argv` empty).
struct RealLauncher {
  std::string name;  ///< as the convention names it: "Open MPI", "MPICH", "SLURM srun", "torchrun"
  std::vector<std::string> argv;
  std::string skip;
  /// Options each job needs of its own (torchrun's rendezvous endpoint), appended to `argv`.
  std::vector<std::string> (*per_job)() = nullptr;

  /// @brief The launcher's argv for one job.
  std::vector<std::string> job() const {
    auto out = argv;
    if (per_job) {
      const auto own = per_job();
      out.insert(out.end(), own.begin(), own.end());
    }
    return out;
  }
};

inline RealLauncher open_mpi_launcher(int n) {
  auto mpirun = find_program({"mpirun.openmpi", "orterun"});
  if (!mpirun) {
    if (auto generic = find_program({"mpirun"}); generic && run_command(accel_test::quoted(*generic) + " --version 2>&1").output.find("Open MPI") != std::string::npos)
      mpirun = generic;
  }
  if (!mpirun) return {"Open MPI", {}, "Open MPI's mpirun is not installed (Debian: openmpi-bin)"};
  return {"Open MPI", {*mpirun, "--oversubscribe", "-np", std::to_string(n)}, ""};
}

inline RealLauncher mpich_launcher(int n) {
  const auto mpiexec = find_program({"mpiexec.mpich", "mpiexec.hydra"});
  if (!mpiexec) return {"MPICH", {}, "MPICH's mpiexec.mpich / mpiexec.hydra is not installed (Debian: mpich)"};
  return {"MPICH", {*mpiexec, "-n", std::to_string(n)}, ""};
}

/// @brief Why no SLURM controller takes jobs here, "" when one does. Under ctest the "slurm"
///        fixture starts a private cluster, or says why it could not in ACCEL_TEST_SLURM_DIR/unavailable.
inline std::string slurm_unavailable() {
  if (!find_program({"srun"}) || !find_program({"sbatch"})) return "SLURM's srun/sbatch are not installed (Debian: slurm-client)";
  const std::string reason = read_file(std::string(ACCEL_TEST_SLURM_DIR).append("/unavailable"));
  if (!reason.empty()) return std::string("the private SLURM cluster did not start: ").append(reason.substr(0, reason.find('\n')));
  // Appended piece by piece: GCC 12 reports a false -Warray-bounds on `"..." + std::string`.
  std::string command;
  if (const auto conf = private_slurm_conf(); !conf.empty()) command.append("SLURM_CONF='").append(conf).append("' ");
  command.append("timeout 10 scontrol ping 2>&1");
  const auto ping = run_command(command);
  if (ping.status != 0 || ping.output.find("is UP") == std::string::npos)
    return "srun is installed but no SLURM controller answers (scontrol ping: " + ping.output.substr(0, ping.output.find('\n')) + ")";
  return "";
}

inline RealLauncher slurm_launcher(int n) {
  if (auto why = slurm_unavailable(); !why.empty()) return {"SLURM srun", {}, why};
  // --overcommit: more tasks than CPUs fit; --immediate: fail instead of queueing behind another job.
  return {"SLURM srun", {*find_program({"srun"}), "-n", std::to_string(n), "--overcommit", "--immediate=60"}, ""};
}

inline RealLauncher torchrun_launcher(int n) {
  const auto torchrun = find_program({"torchrun"});
  if (!torchrun) return {"torchrun", {}, "torchrun is not installed (Debian: python3-torch)"};
  // Debian's torch 1.13 on Python 3.11 crashes with torchrun's default --redirects/--tee values;
  // -r 1 -t 1 (stdout only) works. Not --standalone: torch 1.13 puts that rendezvous on the fixed
  // port 29400, so a second job started meanwhile (another test, or the same test's second job)
  // joins the first's agent store as a client and fails when that agent exits. Each job gets its
  // own endpoint instead, and is_host=1 makes a taken port an error rather than a shared store.
  // --monitor_interval 1: the agent notices its workers' exits within 1 s, not the default 5 s.
  const auto endpoint = [] {
    const std::string port = std::to_string(free_port(2));  // accel's store: one above torchrun's
    return std::vector<std::string>{"--rdzv_endpoint", "127.0.0.1:" + port, "--rdzv_id", "accel-test-" + port};
  };
  return {"torchrun",
          {*torchrun, "-r", "1", "-t", "1", "--nnodes", "1", "--rdzv_backend", "c10d", "--rdzv_conf", "is_host=1",
           "--monitor_interval", "1", "--nproc_per_node", std::to_string(n), "--no_python"},
          "",
          endpoint};
}

/// @brief What a job printed and how its launcher ended.
struct JobResult {
  int code = -1;  ///< the launcher's exit code; -1 when it timed out
  std::string out, err;
};

/// @brief Runs `argv` (a launcher and its program) with launcher_environment(), its output kept in
///        `dir`, for at most `limit`.
inline JobResult run_job(std::vector<std::string> argv, const ScratchDir& dir, std::chrono::seconds limit) {
  JobResult r;
  const pid_t pid = spawn_redirected(std::move(argv), launcher_environment(dir / "launcher"), "/dev/null", dir / "job.out", dir / "job.err");
  REQUIRE(pid > 0);
  r.code = wait_or_kill(pid, std::chrono::steady_clock::now() + limit, std::chrono::seconds(3));
  r.out = read_file(dir / "job.out");
  r.err = read_file(dir / "job.err");
  return r;
}

/// @brief `out` without the "[default0]:" that torchrun -t 1 puts before each line of a rank's output.
inline std::string without_torchrun_prefixes(const std::string& out) {
  static const std::regex prefix(R"((^|\n)\[default[0-9]+\]:)");
  return std::regex_replace(out, prefix, "$1");
}

/// @brief The processes of this machine (other than this one) that have `tag` as one of their
///        arguments: a job's ranks, when the test passed its scratch folder to each as a tag.
inline std::vector<pid_t> processes_with_argument(const std::string& tag) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid()) continue;
    const std::string cmdline = read_file("/proc/" + name + "/cmdline");  // empty for a zombie: it runs nothing
    for (std::size_t pos = 0; pos < cmdline.size();) {
      const auto end = std::min(cmdline.find('\0', pos), cmdline.size());
      if (cmdline.compare(pos, end - pos, tag) == 0) {
        out.push_back(pid);
        break;
      }
      pos = end + 1;
    }
  }
  ::closedir(d);
  return out;
}

/// @brief Fails the test if processes with `tag` among their arguments outlive their launcher by
///        more than `grace` (a launcher that returned while ranks still run); kills those first.
inline void require_nothing_left(const std::string& tag, std::chrono::seconds grace = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + grace;
  auto left = processes_with_argument(tag);
  while (!left.empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    left = processes_with_argument(tag);
  }
  std::string pids;
  for (const pid_t pid : left) pids.append(pids.empty() ? "" : ", ").append(std::to_string(pid)), ::kill(pid, SIGKILL);
  INFO("processes still running " << grace.count() << " s after their launcher ended: " << pids);
  REQUIRE(left.empty());
}

}  // namespace accel_test
