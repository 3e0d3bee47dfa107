// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for state.hpp: the device rule and the state's view of the job, with fake env and devices.
#include <accel/state.hpp>

#include <vector>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"
#include "support/fake_env.hpp"

using accel::DistributedState;
using accel_test::fake_gpus;
using accel_test::torchrun_vars;
using accel_test::with;

TEST_CASE("the seed scenario: CUDA_VISIBLE_DEVICES=2,5 with two processes maps cuda:0 to 2 and cuda:1 to 5", "[state]") {
  for (int rank = 0; rank < 2; ++rank) {
    auto log = std::make_shared<accel_test::FakeDeviceLog>();
    DistributedState s(accel::map_env(with(torchrun_vars(rank, 2, 2), {{"CUDA_VISIBLE_DEVICES", "2,5"}})), fake_gpus(2, 80ull << 30, log));
    CHECK(s.device() == accel::Device::cuda(rank));
    CHECK(s.physical_gpu() == (rank == 0 ? "2" : "5"));
    CHECK(log->made_current == std::vector<int>{rank});
    if (rank == 1) CHECK(s.to_string() == "process=1/2 local=1/2 device=cuda:1 (physical GPU 5)");
  }
}

TEST_CASE("no variables and no driver is one process on the CPU", "[state]") {
  DistributedState s(accel::map_env({}), accel_test::no_driver());
  CHECK(s.process_index() == 0);
  CHECK(s.num_processes() == 1);
  CHECK(s.is_main_process());
  CHECK(s.is_local_main_process());
  CHECK(s.is_last_process());
  CHECK_FALSE(s.use_distributed());
  CHECK(s.device() == accel::Device::cpu());
  CHECK(s.device_status() == "insufficient driver");
  CHECK(s.to_string() == "process=0/1 local=0/1 device=cpu");
}

TEST_CASE("each local process takes the GPU of its local rank when there are enough", "[state]") {
  DistributedState s(accel::map_env(torchrun_vars(6, 8, 4)), fake_gpus(4));
  CHECK(s.device() == accel::Device::cuda(2));
  CHECK(s.machine_index() == 1);
  CHECK(s.num_machines() == 2);
  CHECK_FALSE(s.is_main_process());
  CHECK(s.physical_gpu() == "2");
}

TEST_CASE("one visible GPU per process (per-task binding) is used by every process", "[state]") {
  DistributedState s(accel::map_env(with(torchrun_vars(3, 4, 4), {{"CUDA_VISIBLE_DEVICES", "GPU-abc"}})), fake_gpus(1));
  CHECK(s.device() == accel::Device::cuda(0));
  CHECK(s.to_string() == "process=3/4 local=3/4 device=cuda:0 (physical GPU GPU-abc)");
}

TEST_CASE("fewer GPUs than local processes is a config error naming the counts and the fix", "[state]") {
  const auto env = accel::map_env(with(torchrun_vars(0, 4, 4), {{"CUDA_VISIBLE_DEVICES", "0,1"}}));
  REQUIRE_THROWS_WITH(DistributedState(env, fake_gpus(2)),
                      "[accel.config] 4 processes run on this machine but only 2 GPUs are visible "
                      "(CUDA_VISIBLE_DEVICES='0,1'); start at most 2 processes per machine (--num_processes 2), make more "
                      "GPUs visible, or opt in to sharing with StateOptions::allow_gpu_sharing");
  SECTION("sharing is an explicit opt-in") {
    DistributedState s(accel::map_env(with(torchrun_vars(3, 4, 4), {{"CUDA_VISIBLE_DEVICES", "0,1"}})), fake_gpus(2),
                       {.allow_gpu_sharing = true});
    CHECK(s.device() == accel::Device::cuda(1));
  }
}

TEST_CASE("the cpu option and ACCEL_USE_CPU force the CPU and never touch the GPUs", "[state]") {
  auto log = std::make_shared<accel_test::FakeDeviceLog>();
  DistributedState a(accel::map_env(torchrun_vars(0, 2, 2)), fake_gpus(2, 80ull << 30, log), {.cpu = true});
  CHECK(a.device().is_cpu());
  DistributedState b(accel::map_env(with(torchrun_vars(0, 2, 2), {{"ACCEL_USE_CPU", "true"}})), fake_gpus(2, 80ull << 30, log));
  CHECK(b.device().is_cpu());
  CHECK(log->list_calls == 0);
  CHECK(log->made_current.empty());
}

TEST_CASE("an empty CUDA_VISIBLE_DEVICES leaves the process on the CPU with the diagnosis kept", "[state]") {
  DistributedState s(accel::map_env({{"CUDA_VISIBLE_DEVICES", ""}}), fake_gpus(0));
  CHECK(s.device().is_cpu());
  CHECK_THAT(s.visible_devices().diagnostics.at(0), accel_test::contains("empty string"));
}

TEST_CASE("the state splits inputs by its own rank", "[state]") {
  DistributedState s(accel::map_env(torchrun_vars(1, 3, 3)), accel_test::no_driver());
  std::vector<int> items{0, 1, 2, 3, 4, 5, 6};
  auto mine = s.split_between_processes(items);
  CHECK(std::vector<int>(mine.begin(), mine.end()) == std::vector<int>{3, 4});
  CHECK(s.split_between_processes(items, {.apply_padding = true}).size() == 3);
}

TEST_CASE("the default constructor reads the real environment", "[state]") {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("ACCEL_USE_CPU", "1", 1);
  DistributedState s;
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("ACCEL_USE_CPU");
  CHECK(s.process_index() == 1);
  CHECK(s.device().is_cpu());
  REQUIRE_THROWS_AS([] {
    ::setenv("RANK", "x", 1);
    struct Unset {
      ~Unset() { ::unsetenv("RANK"); }
    } guard;
    return DistributedState();
  }(), accel::config_error);
}
