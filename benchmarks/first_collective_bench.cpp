// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The job that benchmarks/compare/start_to_collective.py starts under each launcher: every rank
// finds out who it is, meets the others in one barrier (the job's first collective) and exits.
#include <accel/comm/collectives.hpp>

#include <cstdio>

int main() {
  try {
    accel::DistributedState state;
    accel::wait_for_everyone(state);
    return 0;
  } catch (const accel::error& e) {
    std::fprintf(stderr, "first_collective_bench: %s\n", e.what());
    return 1;
  }
}
