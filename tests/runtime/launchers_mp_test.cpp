// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// accel under each real launcher installed here (Open MPI's mpirun, MPICH's mpiexec, SLURM's srun
// and sbatch, torchrun) and under `accel launch`: every rank recognises the launcher's convention,
// numbers itself as the launcher did, picks its device, finds its job's identity and gathers with
// the others; a rank that exits with a code fails the job with that code. A launcher that cannot
// run here is reported with WARN("test skipped: ...") and its case checks nothing (ctest: skipped).
#include <fstream>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/launchers.hpp"

using accel_test::without_torchrun_prefixes;
using namespace std::chrono_literals;

namespace {

const std::string whoami = std::string(ACCEL_TEST_CHILD_DIR) + "/whoami";

// What rank 0 of `world` ranks started by `launcher` prints: one line per rank, in rank order.
std::string expected_lines(const std::string& launcher, int world) {
  std::string s;
  for (int r = 0; r < world; ++r)
    s += "process=" + std::to_string(r) + "/" + std::to_string(world) + " local=" + std::to_string(r) + "/" +
         std::to_string(world) + " device=cpu launcher=" + launcher + " job=yes\n";
  return s;
}

// Every check for one launcher: 3 ranks describe themselves correctly, then a job whose rank 1
// exits with 7 after the last collective ends with `failed_code` (7 where the launcher passes the
// rank's code on; torchrun's agent reports 1).
void check_launcher(const accel_test::RealLauncher& launcher, const std::string& convention, int failed_code) {
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  {
    accel_test::ScratchDir dir("launchers");
    auto argv = launcher.job();
    argv.push_back(whoami);
    const auto job = accel_test::run_job(argv, dir, 90s);
    INFO(launcher.name << " stderr:\n" << job.err);
    CHECK(job.code == 0);
    CHECK(without_torchrun_prefixes(job.out) == expected_lines(convention, 3));
  }
  {
    accel_test::ScratchDir dir("launchers");
    auto argv = launcher.job();
    argv.insert(argv.end(), {whoami, "1", "7"});
    const auto job = accel_test::run_job(argv, dir, 90s);
    INFO(launcher.name << " stderr:\n" << job.err);
    CHECK(job.code == failed_code);
    CHECK(without_torchrun_prefixes(job.out) == expected_lines(convention, 3));
  }
}

}  // namespace

TEST_CASE("under Open MPI's mpirun every rank knows itself and a failing rank's code fails the job", "[launchers][mp]") {
  check_launcher(accel_test::open_mpi_launcher(3), "Open MPI", 7);
}

TEST_CASE("under MPICH's mpiexec every rank knows itself and a failing rank's code fails the job", "[launchers][mp]") {
  check_launcher(accel_test::mpich_launcher(3), "MPICH/Intel MPI", 7);
}

TEST_CASE("under SLURM's srun every rank knows itself and a failing rank's code fails the job", "[launchers][mp]") {
  check_launcher(accel_test::slurm_launcher(3), "SLURM srun", 7);
}

TEST_CASE("under torchrun every rank knows itself and a failing rank fails the job", "[launchers][mp]") {
  check_launcher(accel_test::torchrun_launcher(3), "torchrun", 1);
}

TEST_CASE("under accel launch every rank knows itself and a failing rank's code fails the job", "[launchers][mp]") {
  check_launcher({"accel launch", {ACCEL_TEST_CLI, "launch", "--num_processes", "3"}, ""}, "accel launch", 7);
}

TEST_CASE("a batch script submitted with sbatch runs its srun step with the batch job's identity", "[launchers][mp]") {
  if (const auto why = accel_test::slurm_unavailable(); !why.empty()) {
    WARN("test skipped: " << why);
    return;
  }
  accel_test::ScratchDir dir("launchers");
  {
    std::ofstream script(dir / "job.sh");
    script << "#!/bin/sh\nexec srun -n 2 --overcommit '" << whoami << "' 1 5\n";
  }
  // -W: wait for the job and exit with its code; the job's output goes to the file -o names.
  const auto job = accel_test::run_job({*accel_test::find_program({"sbatch"}), "-W", "--quiet", "-o", dir / "slurm.out", dir / "job.sh"}, dir, 90s);
  const auto out = accel_test::read_file(dir / "slurm.out");
  INFO("sbatch stderr:\n" << job.err << "\njob output:\n" << out);
  CHECK(job.code == 5);
  CHECK(out.find(expected_lines("SLURM srun", 2)) != std::string::npos);
}
