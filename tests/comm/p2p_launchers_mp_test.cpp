// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Point-to-point messages under every real launcher: Open MPI's mpirun, MPICH's mpiexec, SLURM's
// srun (the private cluster of the "slurm" fixture) and torchrun (accel launch: p2p_mp_test.cpp).
// Each runs tests/multiprocess/children/p2p_child.cpp: a ring of sends among 3 ranks; ping-pong
// of every payload kind with a 4 MiB buffer (larger than a shared-memory channel's ring, so it
// streams; the 64 MiB case runs under accel launch); mismatched sizes and types, which fail both
// ends naming both ranks; and a rank SIGKILLed while its peer waits in recv, which must end the
// job with a non-zero code and leave nothing running. A launcher that cannot run here is
// reported with WARN("test skipped: ...") and its case checks nothing (ctest: skipped).
//
// What the launchers do with the killed rank (seen here, 2-3 runs each): every one notices the
// signal, stops the job and exits non-zero. Open MPI's mpirun exits with 137 (128 + SIGKILL) and
// srun with 137 ("Force Terminated"); the survivor has reported by then (about 10-30 ms after the
// kill), though nothing makes them wait for it. MPICH's mpiexec (Hydra) exits with 9 (the signal's
// number) and kills the survivor before it reports. torchrun's agent waits for its workers and
// exits with 1 after the survivor reported. So the report is required under torchrun only, and
// checked wherever it appears: it names rank 1 and comes within 5 s of the kill.
#include <algorithm>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/launchers.hpp"
#include "support/p2p_expected.hpp"

using namespace std::chrono_literals;

namespace {

const std::string p2p_child = std::string(ACCEL_TEST_CHILD_DIR) + "/p2p_child";

// Bound on one job: far above what any launcher takes here (torchrun's start is the slowest, about
// 10 s on a loaded 2-core machine), below ctest's 120 s per case.
constexpr auto job_bound = 100s;

// Starts p2p_child with `args` under `launcher`, tagged with its scratch folder so that what
// outlives the launcher can be found; returns what the job printed, torchrun's prefixes removed.
accel_test::JobResult run_p2p_job(const accel_test::RealLauncher& launcher, const accel_test::ScratchDir& dir,
                                  const std::vector<std::string>& args) {
  auto argv = launcher.job();
  argv.push_back(p2p_child);
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(dir.path);
  auto job = accel_test::run_job(argv, dir, job_bound);
  job.out = accel_test::without_torchrun_prefixes(job.out);
  job.err = accel_test::without_torchrun_prefixes(job.err);
  return job;
}

// The job's launcher and its ranks, as a launcher function of the world size.
using LauncherOf = accel_test::RealLauncher (*)(int);

void check_ring(LauncherOf launcher_of) {
  const auto launcher = launcher_of(3);
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("p2p");
  const auto job = run_p2p_job(launcher, dir, {"ring"});
  INFO(launcher.name << " stderr:\n" << job.err << "\nstdout:\n" << job.out);
  CHECK(job.code == 0);
  CHECK(job.out == "rank 0 got 'hello from rank 2'\nrank 1 got 'hello from rank 0'\nrank 2 got 'hello from rank 1'\n");
  accel_test::require_nothing_left(dir.path);
}

void check_pingpong(LauncherOf launcher_of) {
  const auto launcher = launcher_of(2);
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("p2p");
  const auto job = run_p2p_job(launcher, dir, {"pingpong", "big=" + std::to_string(std::size_t{4} << 20)});
  INFO(launcher.name << " stderr:\n" << job.err << "\nstdout:\n" << job.out);
  CHECK(job.code == 0);
  CHECK(job.out == "rank 0 exchanged every kind\nrank 1 exchanged every kind\n");
  accel_test::require_nothing_left(dir.path);
}

void check_mismatch(LauncherOf launcher_of) {
  const auto launcher = launcher_of(2);
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("p2p");
  const auto job = run_p2p_job(launcher, dir, {"mismatch"});
  INFO(launcher.name << " stderr:\n" << job.err << "\nstdout:\n" << job.out);
  CHECK(job.code == 0);
  CHECK(job.out == accel_test::p2p_mismatch_lines(0) + accel_test::p2p_mismatch_lines(1));
  accel_test::require_nothing_left(dir.path);
}

// Rank 1 SIGKILLs itself 500 ms into rank 0's recv from it. `failed_codes`: the launcher's exit
// codes for that job (its convention); `survivor_reports`: whether the launcher always lets rank 0
// report before stopping it.
void check_killed(LauncherOf launcher_of, const std::vector<int>& failed_codes, bool survivor_reports) {
  const auto launcher = launcher_of(2);
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("p2p");
  const auto job = run_p2p_job(launcher, dir, {"kill", "recv"});
  const std::string said = job.err + "\n" + job.out;  // Hydra and torchrun may report on stdout
  INFO(launcher.name << " exit code " << job.code << "; output:\n" << said);
  REQUIRE(job.code != -1);  // -1: still running at the bound, a hang
  CHECK(job.code != 0);
  CHECK(std::find(failed_codes.begin(), failed_codes.end(), job.code) != failed_codes.end());
  // "rank 0 after N ms: <error>", N counted from the start of the recv; rank 1 died 500 ms in.
  const auto at = said.find("rank 0 after ");
  if (survivor_reports) CHECK(at != std::string::npos);
  if (at != std::string::npos) {
    const std::string line = said.substr(at, said.find('\n', at) - at);
    INFO("rank 0 said: " << line);
    CHECK(std::stol(line.substr(13)) < 5500);
    CHECK(line.find("rank 1 ") != std::string::npos);
    CHECK(line.find("during message #1 from rank 1 to rank 0") != std::string::npos);
  }
  accel_test::require_nothing_left(dir.path);
}

}  // namespace

TEST_CASE("under Open MPI's mpirun a ring of point-to-point sends delivers every message", "[p2p][mp][launchers]") {
  check_ring(accel_test::open_mpi_launcher);
}
TEST_CASE("under Open MPI's mpirun ping-pong carries every payload kind in order", "[p2p][mp][launchers]") {
  check_pingpong(accel_test::open_mpi_launcher);
}
TEST_CASE("under Open MPI's mpirun a size or type mismatch fails both ends naming both ranks", "[p2p][mp][launchers]") {
  check_mismatch(accel_test::open_mpi_launcher);
}
TEST_CASE("under Open MPI's mpirun a rank killed while its peer waits in recv fails the job, leaving nothing running",
          "[p2p][mp][launchers]") {
  check_killed(accel_test::open_mpi_launcher, {137, 2}, false);  // 2: had it seen rank 0's exit first
}

TEST_CASE("under MPICH's mpiexec a ring of point-to-point sends delivers every message", "[p2p][mp][launchers]") {
  check_ring(accel_test::mpich_launcher);
}
TEST_CASE("under MPICH's mpiexec ping-pong carries every payload kind in order", "[p2p][mp][launchers]") {
  check_pingpong(accel_test::mpich_launcher);
}
TEST_CASE("under MPICH's mpiexec a size or type mismatch fails both ends naming both ranks", "[p2p][mp][launchers]") {
  check_mismatch(accel_test::mpich_launcher);
}
TEST_CASE("under MPICH's mpiexec a rank killed while its peer waits in recv fails the job, leaving nothing running",
          "[p2p][mp][launchers]") {
  check_killed(accel_test::mpich_launcher, {9}, false);
}

TEST_CASE("under SLURM's srun a ring of point-to-point sends delivers every message", "[p2p][mp][launchers]") {
  check_ring(accel_test::slurm_launcher);
}
TEST_CASE("under SLURM's srun ping-pong carries every payload kind in order", "[p2p][mp][launchers]") {
  check_pingpong(accel_test::slurm_launcher);
}
TEST_CASE("under SLURM's srun a size or type mismatch fails both ends naming both ranks", "[p2p][mp][launchers]") {
  check_mismatch(accel_test::slurm_launcher);
}
TEST_CASE("under SLURM's srun a rank killed while its peer waits in recv fails the job, leaving nothing running", "[p2p][mp][launchers]") {
  check_killed(accel_test::slurm_launcher, {137, 2}, false);  // 2: had it seen rank 0's exit first
}

TEST_CASE("under torchrun a ring of point-to-point sends delivers every message", "[p2p][mp][launchers]") {
  check_ring(accel_test::torchrun_launcher);
}
TEST_CASE("under torchrun ping-pong carries every payload kind in order", "[p2p][mp][launchers]") {
  check_pingpong(accel_test::torchrun_launcher);
}
TEST_CASE("under torchrun a size or type mismatch fails both ends naming both ranks", "[p2p][mp][launchers]") {
  check_mismatch(accel_test::torchrun_launcher);
}
TEST_CASE("under torchrun a rank killed while its peer waits in recv fails the job, leaving nothing running", "[p2p][mp][launchers]") {
  check_killed(accel_test::torchrun_launcher, {1}, true);
}
