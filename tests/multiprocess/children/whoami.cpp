// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for the real-launcher tests (tests/runtime/launchers_mp_test.cpp). Every rank describes
// itself (DistributedState's line, the launcher convention it recognised, whether it found a job
// identity); rank 0 gathers the lines and prints them in rank order. Then all ranks meet once more
// and rank R exits with CODE when asked: whoami [R CODE].
#include <accel/comm/collectives.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  int rank = -1;
  try {
    accel::DistributedState state;
    rank = state.process_index();
    const auto& env = state.launch_env();
    const std::string line = state.to_string() + " launcher=" + accel::launcher_name(env.launcher) +
                             " job=" + (env.job_id.empty() ? "none" : "yes");
    const auto lines = accel::gather_object(state, line);
    for (const auto& l : lines) accel::print(state, l);
    accel::wait_for_everyone(state);
    if (argc > 2 && rank == std::atoi(argv[1])) return std::atoi(argv[2]);
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}
