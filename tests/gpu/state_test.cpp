// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// GPU tests for device binding with the real driver ([.gpu]: run by tests/gpu/run.sh only).
#include <accel/state.hpp>

#include <cuda_runtime_api.h>

#include "support/catch.hpp"

TEST_CASE("the real device query sees the GPU with its memory and UUID", "[.gpu][state]") {
  const auto list = accel::default_device_query().list(true);
  REQUIRE_FALSE(list.gpus.empty());
  CHECK(list.status.empty());
  CHECK_FALSE(list.driver.empty());
  CHECK(list.gpus[0].total_memory > (1ull << 30));
  CHECK(list.gpus[0].free_memory > 0);
  CHECK(list.gpus[0].free_memory <= list.gpus[0].total_memory);
  CHECK(list.gpus[0].uuid.rfind("GPU-", 0) == 0);
  CHECK(list.gpus[0].uuid.size() == 40);
}

TEST_CASE("a single process binds cuda:0 and makes it current", "[.gpu][state]") {
  accel::DistributedState state(accel::map_env({}), accel::default_device_query());
  REQUIRE(state.device() == accel::Device::cuda(0));
  int current = -1;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  CHECK(current == 0);
  CHECK_FALSE(state.gpu_name().empty());
}

TEST_CASE("two local processes on one GPU are refused unless sharing is allowed", "[.gpu][state]") {
  const int n = accel::visible_gpu_count();
  REQUIRE(n >= 1);
  const auto env = accel::map_env({{"RANK", "1"}, {"WORLD_SIZE", std::to_string(n + 1)}, {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", std::to_string(n + 1)}});
  if (n == 1) {
    // one GPU is per-task binding: every process uses cuda:0
    CHECK(accel::DistributedState(env, accel::default_device_query()).device() == accel::Device::cuda(0));
  } else {
    REQUIRE_THROWS_AS(accel::DistributedState(env, accel::default_device_query()), accel::config_error);
  }
}
