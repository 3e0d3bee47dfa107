// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Process groups (split, grid_groups) under every launcher: accel launch, Open MPI's mpirun,
// MPICH's mpiexec, SLURM's srun (the private cluster of the "slurm" fixture) and torchrun. Each
// starts a 4-process job of tests/multiprocess/children/groups_child.cpp that splits into a 2 x 2
// grid and runs collectives in its stage groups, replica groups and the world interleaved; then a
// job whose ranks disagree on the grid and on a split's color, which must be an error on every
// rank naming the ranks (not a hang), fail the job, and leave no process running. A launcher that
// cannot run here is reported with WARN("test skipped: ...") and its case checks nothing.
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/files.hpp"
#include "support/launchers.hpp"

using namespace std::chrono_literals;

namespace {

const std::string groups_child = std::string(ACCEL_TEST_CHILD_DIR) + "/groups_child";

// Bound on one job: far above what any launcher takes here (torchrun's start is the slowest, about
// 10 s on a loaded 2-core machine), below ctest's 120 s per case.
constexpr auto job_bound = 100s;

accel_test::RealLauncher accel_launch(int n) { return {"accel launch", {ACCEL_TEST_CLI, "launch", "--num_processes", std::to_string(n)}, ""}; }

// Starts groups_child `mode` under `launcher` with 4 ranks, tagged with its scratch folder so that
// what outlives the launcher can be found; returns what the job printed, torchrun's prefixes removed.
accel_test::JobResult run_groups_job(const accel_test::RealLauncher& launcher, const accel_test::ScratchDir& dir, const std::string& mode) {
  auto argv = launcher.job();
  argv.insert(argv.end(), {groups_child, mode, dir.path});
  auto job = accel_test::run_job(argv, dir, job_bound);
  job.out = accel_test::without_torchrun_prefixes(job.out);
  job.err = accel_test::without_torchrun_prefixes(job.err);
  return job;
}

// Whether a line of `text` starts with `start`.
bool has_line(const std::string& text, const std::string& start) {
  return text.rfind(start, 0) == 0 || text.find("\n" + start) != std::string::npos;
}

void check_grid(const accel_test::RealLauncher& launcher) {
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("groups");
  const auto job = run_groups_job(launcher, dir, "grid");
  INFO(launcher.name << " stderr:\n" << job.err << "\nstdout:\n" << job.out);
  CHECK(job.code == 0);
  CHECK(job.out ==
        "rank 0 replica 0 stage 0: stage group members=0,1 sum=3, replica group members=0,2 sum=4, world members=0,1,2,3 sum=10\n"
        "rank 1 replica 0 stage 1: stage group members=0,1 sum=3, replica group members=1,3 sum=6, world members=0,1,2,3 sum=10\n"
        "rank 2 replica 1 stage 0: stage group members=2,3 sum=7, replica group members=0,2 sum=4, world members=0,1,2,3 sum=10\n"
        "rank 3 replica 1 stage 1: stage group members=2,3 sum=7, replica group members=1,3 sum=6, world members=0,1,2,3 sum=10\n");
  accel_test::require_nothing_left(dir.path);
}

// `failed_code`: the job's exit code when its ranks exit with 2 (torchrun's agent reports 1).
void check_mismatch(const accel_test::RealLauncher& launcher, int failed_code) {
  if (!launcher.skip.empty()) {
    WARN("test skipped: " << launcher.skip);
    return;
  }
  accel_test::ScratchDir dir("groups");
  const auto job = run_groups_job(launcher, dir, "mismatch");
  const std::string said = job.err + "\n" + job.out;  // Hydra and torchrun may report on stdout
  INFO(launcher.name << " exit code " << job.code << "; output:\n" << said);
  REQUIRE(job.code != -1);  // -1: still running at the bound, a hang
  CHECK(job.code == failed_code);
  for (int r = 0; r < 4; ++r) {
    const std::string rank = "rank " + std::to_string(r) + ": ";
    CHECK(has_line(said, rank + "[accel.usage] grid_groups: the ranks pass different grids (replicas x stages): ranks 0, 1, 2 pass "
                                "2 x 2, rank 3 passes 1 x 4"));
    if (r == 1)
      CHECK(has_line(said, rank + "[accel.usage] split: color -5 is negative; pass a color of 0 or more, or accel::no_group"));
    else
      CHECK(has_line(said, rank + "[accel.comm] rank 1 failed before split #"));
  }
  accel_test::require_nothing_left(dir.path);
}

}  // namespace

TEST_CASE("under accel launch a 2 x 2 grid runs collectives in its stage groups, replica groups and the world interleaved",
          "[groups][mp][launchers]") {
  check_grid(accel_launch(4));
}

TEST_CASE("under accel launch ranks that disagree on a grid or a split fail on every rank, naming them", "[groups][mp][launchers]") {
  check_mismatch(accel_launch(4), 2);
}

TEST_CASE("under Open MPI's mpirun a 2 x 2 grid runs collectives in its stage groups, replica groups and the world interleaved",
          "[groups][mp][launchers]") {
  check_grid(accel_test::open_mpi_launcher(4));
}

TEST_CASE("under Open MPI's mpirun ranks that disagree on a grid or a split fail on every rank, naming them", "[groups][mp][launchers]") {
  check_mismatch(accel_test::open_mpi_launcher(4), 2);
}

TEST_CASE("under MPICH's mpiexec a 2 x 2 grid runs collectives in its stage groups, replica groups and the world interleaved",
          "[groups][mp][launchers]") {
  check_grid(accel_test::mpich_launcher(4));
}

TEST_CASE("under MPICH's mpiexec ranks that disagree on a grid or a split fail on every rank, naming them", "[groups][mp][launchers]") {
  check_mismatch(accel_test::mpich_launcher(4), 2);
}

TEST_CASE("under SLURM's srun a 2 x 2 grid runs collectives in its stage groups, replica groups and the world interleaved",
          "[groups][mp][launchers]") {
  check_grid(accel_test::slurm_launcher(4));
}

TEST_CASE("under SLURM's srun ranks that disagree on a grid or a split fail on every rank, naming them", "[groups][mp][launchers]") {
  check_mismatch(accel_test::slurm_launcher(4), 2);
}

TEST_CASE("under torchrun a 2 x 2 grid runs collectives in its stage groups, replica groups and the world interleaved",
          "[groups][mp][launchers]") {
  check_grid(accel_test::torchrun_launcher(4));
}

TEST_CASE("under torchrun ranks that disagree on a grid or a split fail on every rank, naming them", "[groups][mp][launchers]") {
  check_mismatch(accel_test::torchrun_launcher(4), 1);
}
