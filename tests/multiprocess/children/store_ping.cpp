// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Child for launch tests: connects to the job's store the way DistributedState users do, publishes
// its rank, reads the next rank's key, and prints what it got, where the store was and the soft
// open-file limit it started with.
#include <accel/comm/store.hpp>
#include <accel/runtime/env.hpp>

#include <sys/resource.h>

#include <cstdio>
#include <string>

int main() {
  try {
    const accel::LaunchEnv env = accel::read_launch_env(accel::process_env());
    const auto client = accel::connect_job_store(env);
    client->set("rank" + std::to_string(env.rank), "hello from " + std::to_string(env.rank));
    const int next = (env.rank + 1) % env.world_size;
    const std::string got = client->get_string("rank" + std::to_string(next));
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    std::printf("rank %d store=%s got '%s' nofile %llu\n", env.rank, env.store_address.value_or("none").c_str(), got.c_str(),
                static_cast<unsigned long long>(files.rlim_cur));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_ping: %s\n", e.what());
    return 1;
  }
}
