// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child program of tests/comm/collectives_mp_test.cpp: one rank of a 4-process job split into a
// 2 x 2 grid (grid_groups). argv[1] picks the scenario; errors go to stderr as "rank R: <message>".
// Any further argument is ignored: tests pass a tag there to find the job's processes afterwards.
//   grid   three times over: all_gather, all_reduce and gather_object in the stage group, then the
//          replica group, then the world (a large all_reduce in each group, through shared memory);
//          every rank checks its results and the main process prints one line per rank
//   die    job rank 3 dies (std::_Exit(9)) while rank 2, its stage group's other member, waits in
//          gather_object; ranks 0 and 1 finish a stage-group gather and exit normally first
//   mismatch the ranks disagree twice: job rank 3 asks grid_groups for 1 x 4 while the others ask
//          for 2 x 2, then job rank 1 passes split the color -5; every rank reports each error
//          ("rank R: <message>"), the world meets once more after each (the disagreement leaves it
//          in step), and every rank exits with 2, so a launcher that ends the job at the first
//          non-zero exit cannot stop a rank before it has reported
#include <accel/comm/collectives.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {
void expect(bool ok, const std::string& what) {
  if (!ok) throw accel::comm_error("wrong result: " + what);
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Collectives over one group: returns "members=.. sum=.." after checking them.
std::string exercise(accel::Communicator& group, int job_rank, const std::vector<int>& members, std::size_t big) {
  const auto gathered = accel::gather_object(group, job_rank);
  expect(gathered == members, "gather_object gave " + join(gathered) + ", expected " + join(members));
  std::vector<std::int32_t> mine(2, job_rank), all(2 * members.size());
  accel::all_gather(group, std::span<const std::int32_t>(mine), std::span(all));
  for (std::size_t i = 0; i < members.size(); ++i) expect(all[2 * i] == members[i] && all[2 * i + 1] == members[i], "all_gather");
  std::vector<float> values(big, static_cast<float>(job_rank + 1));
  accel::all_reduce(group, std::span(values), accel::ReduceOp::sum);
  float want = 0;
  for (int m : members) want += static_cast<float>(m + 1);
  expect(values.front() == want && values.back() == want, "all_reduce");
  return "members=" + join(members) + " sum=" + std::to_string(static_cast<int>(want));
}
// Reports an error every rank must see, then meets the others once more.
void report(accel::DistributedState& state, int rank, const accel::error& e) {
  std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  std::fflush(stderr);
  accel::wait_for_everyone(state);
}

// The "mismatch" scenario: 2 when both disagreements were errors on this rank, 3 when one was not.
int disagree(accel::DistributedState& state, int rank) {
  int errors = 0;
  try {
    accel::grid_groups(state, rank == 3 ? 1 : 2, rank == 3 ? 4 : 2);
  } catch (const accel::error& e) {
    report(state, rank, e);
    ++errors;
  }
  try {
    accel::split(state, rank == 1 ? -5 : rank % 2, rank);
  } catch (const accel::error& e) {
    report(state, rank, e);
    ++errors;
  }
  if (errors == 2) return 2;
  std::fprintf(stderr, "rank %d: a disagreement was not an error here\n", rank);
  return 3;
}
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "grid";
  int rank = -1;
  try {
    accel::DistributedState state;
    rank = state.process_index();
    accel::Communicator& world = accel::communicator(state);
    if (mode == "mismatch") return disagree(state, rank);
    const auto grid = accel::grid_groups(state, 2, 2);
    const std::vector<int> stage_members = {grid.replica * 2, grid.replica * 2 + 1};
    const std::vector<int> replica_members = {grid.stage, 2 + grid.stage};
    if (mode == "grid") {
      std::string line;
      for (int round = 0; round < 3; ++round) {
        const std::string stage = exercise(*grid.stage_group, rank, stage_members, 1u << 20);
        const std::string replica = exercise(*grid.replica_group, rank, replica_members, 1u << 20);
        const std::string whole = exercise(world, rank, {0, 1, 2, 3}, 1000);
        line = "rank " + std::to_string(rank) + " replica " + std::to_string(grid.replica) + " stage " + std::to_string(grid.stage) +
               ": stage group " + stage + ", replica group " + replica + ", world " + whole;
      }
      for (const auto& l : accel::gather_object(state, line)) accel::print(state, l);
    } else if (mode == "die") {
      accel::wait_for_everyone(state);
      if (rank == 3) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // ranks 0 and 1 have left, rank 2 waits
        std::_Exit(9);
      }
      accel::gather_object(*grid.stage_group, rank);
    }
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}
