// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for state.hpp: the device rule and the state's view of the job, with fake env and devices.
#include <accel/state.hpp>

#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"
#include "support/fake_env.hpp"

using accel::Device;
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
    CHECK(s.devices() == std::vector<accel::Device>{accel::Device::cuda(rank)});
    CHECK(s.physical_gpus() == std::vector<std::string>{rank == 0 ? "2" : "5"});
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

namespace {

std::vector<Device> gpus(std::initializer_list<int> indices) {
  std::vector<Device> out;
  for (int i : indices) out.push_back(Device::cuda(i));
  return out;
}

using Ids = std::vector<std::string>;

}  // namespace

TEST_CASE("with two GPUs per process and four visible, local process r owns GPUs 2r and 2r+1", "[state][groups]") {
  for (int rank = 0; rank < 2; ++rank) {
    auto log = std::make_shared<accel_test::FakeDeviceLog>();
    DistributedState s(accel::map_env(torchrun_vars(rank, 2, 2)), fake_gpus(4, 80ull << 30, log), {.gpus_per_process = 2});
    CHECK(s.devices() == (rank == 0 ? gpus({0, 1}) : gpus({2, 3})));
    CHECK(s.device() == Device::cuda(2 * rank));
    CHECK(log->made_current == std::vector<int>{2 * rank});  // the execution device only
    CHECK(s.physical_gpus() == (rank == 0 ? Ids{"0", "1"} : Ids{"2", "3"}));
    CHECK(s.physical_gpu() == s.physical_gpus().front());
  }
  const DistributedState s(accel::map_env(torchrun_vars(1, 2, 2)), fake_gpus(4), {.gpus_per_process = 2});
  CHECK(s.to_string() == "process=1/2 local=1/2 device=cuda:2 group=cuda:2,cuda:3 (physical GPUs 2,3)");
}

TEST_CASE("with two GPUs per process and eight visible, two local processes use the first four", "[state][groups]") {
  // Two machines of two processes each: local ranks, not global ones, pick the group.
  for (int rank = 0; rank < 4; ++rank) {
    auto log = std::make_shared<accel_test::FakeDeviceLog>();
    DistributedState s(accel::map_env(with(torchrun_vars(rank, 4, 2), {{"CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7"}})),
                       fake_gpus(8, 80ull << 30, log), {.gpus_per_process = 2});
    const int local = rank % 2;
    CHECK(s.devices() == (local == 0 ? gpus({0, 1}) : gpus({2, 3})));
    CHECK(s.device() == Device::cuda(2 * local));
    CHECK(log->made_current == std::vector<int>{2 * local});
  }
  const DistributedState four(accel::map_env(torchrun_vars(1, 2, 2)), fake_gpus(8), {.gpus_per_process = 4});
  CHECK(four.devices() == gpus({4, 5, 6, 7}));
  CHECK(four.to_string() == "process=1/2 local=1/2 device=cuda:4 group=cuda:4,cuda:5,cuda:6,cuda:7 (physical GPUs 4,5,6,7)");
}

TEST_CASE("a group's physical GPUs come from CUDA_VISIBLE_DEVICES, with holes or UUIDs", "[state][groups]") {
  SECTION("holes: 0,2,5,7") {
    const auto env = [](int rank) { return accel::map_env(with(torchrun_vars(rank, 2, 2), {{"CUDA_VISIBLE_DEVICES", "0,2,5,7"}})); };
    const DistributedState a(env(0), fake_gpus(4), {.gpus_per_process = 2});
    CHECK(a.physical_gpus() == Ids{"0", "2"});
    const DistributedState b(env(1), fake_gpus(4), {.gpus_per_process = 2});
    CHECK(b.devices() == gpus({2, 3}));
    CHECK(b.physical_gpus() == Ids{"5", "7"});
    CHECK(b.physical_gpu() == "5");
    CHECK(b.to_string() == "process=1/2 local=1/2 device=cuda:2 group=cuda:2,cuda:3 (physical GPUs 5,7)");
  }
  SECTION("UUIDs") {
    const DistributedState s(accel::map_env(with(torchrun_vars(1, 2, 2), {{"CUDA_VISIBLE_DEVICES", "GPU-a1,GPU-b2,GPU-c3,GPU-d4"}})),
                             fake_gpus(4), {.gpus_per_process = 2});
    CHECK(s.physical_gpus() == Ids{"GPU-c3", "GPU-d4"});
    CHECK(s.physical_gpu() == "GPU-c3");
    CHECK(s.to_string() == "process=1/2 local=1/2 device=cuda:2 group=cuda:2,cuda:3 (physical GPUs GPU-c3,GPU-d4)");
  }
}

TEST_CASE("per-task binding: a process that sees exactly its own K GPUs owns all of them", "[state][groups]") {
  auto log = std::make_shared<accel_test::FakeDeviceLog>();
  const DistributedState s(accel::map_env(with(torchrun_vars(3, 4, 4), {{"CUDA_VISIBLE_DEVICES", "6,7"}})),
                           fake_gpus(2, 80ull << 30, log), {.gpus_per_process = 2});
  CHECK(s.devices() == gpus({0, 1}));
  CHECK(s.physical_gpus() == Ids{"6", "7"});
  CHECK(log->made_current == std::vector<int>{0});
  CHECK(s.to_string() == "process=3/4 local=3/4 device=cuda:0 group=cuda:0,cuda:1 (physical GPUs 6,7)");
  // Three visible GPUs are neither K nor enough for four groups: that is no binding.
  REQUIRE_THROWS_AS(DistributedState(accel::map_env(torchrun_vars(3, 4, 4)), fake_gpus(3), {.gpus_per_process = 2}),
                    accel::config_error);
}

TEST_CASE("too few GPUs for every group is a config error naming the counts and the fixes", "[state][groups]") {
  const auto env = accel::map_env(with(torchrun_vars(0, 2, 2), {{"CUDA_VISIBLE_DEVICES", "0,1,2"}}));
  REQUIRE_THROWS_AS(DistributedState(env, fake_gpus(3), {.gpus_per_process = 2}), accel::config_error);
  REQUIRE_THROWS_WITH(DistributedState(env, fake_gpus(3), {.gpus_per_process = 2}),
                      "[accel.config] 2 processes run on this machine with 2 GPUs each (4 GPUs) but only 3 GPUs are visible "
                      "(CUDA_VISIBLE_DEVICES='0,1,2'); start at most 1 process per machine (--num_processes 1), ask for 1 GPU "
                      "per process (--gpus_per_process 1 or ACCEL_GPUS_PER_PROCESS=1), or make 4 GPUs visible (or exactly 2 to "
                      "each process)");
  SECTION("a fix that cannot help is not offered") {
    REQUIRE_THROWS_WITH(DistributedState(accel::map_env(torchrun_vars(0, 3, 3)), fake_gpus(1), {.gpus_per_process = 2}),
                        "[accel.config] 3 processes run on this machine with 2 GPUs each (6 GPUs) but only 1 GPU is visible "
                        "(CUDA_VISIBLE_DEVICES unset); make 6 GPUs visible (or exactly 2 to each process)");
  }
  SECTION("sharing is for single GPUs: groups are not shared") {
    REQUIRE_THROWS_WITH(DistributedState(env, fake_gpus(3), {.allow_gpu_sharing = true, .gpus_per_process = 2}),
                        accel_test::contains("or make 4 GPUs visible (or exactly 2 to each process); "
                                             "StateOptions::allow_gpu_sharing shares single GPUs only: groups of 2 GPUs are "
                                             "not shared"));
  }
}

TEST_CASE("ACCEL_GPUS_PER_PROCESS gives K when the options do not", "[state][groups][env]") {
  const auto vars = [](const char* k) { return accel::map_env(with(torchrun_vars(1, 2, 2), {{"ACCEL_GPUS_PER_PROCESS", k}})); };
  CHECK(DistributedState(vars("2"), fake_gpus(4)).devices() == gpus({2, 3}));
  CHECK(DistributedState(vars(" 2"), fake_gpus(4)).devices() == gpus({2, 3}));
  CHECK(DistributedState(vars("1"), fake_gpus(4)).devices() == gpus({1}));
  CHECK(DistributedState(accel::map_env(torchrun_vars(1, 2, 2)), fake_gpus(4)).devices() == gpus({1}));  // unset: 1
  // The options win, and then the variable is not read.
  CHECK(DistributedState(vars("2"), fake_gpus(4), {.gpus_per_process = 1}).devices() == gpus({1}));
  CHECK(DistributedState(vars("x"), fake_gpus(4), {.gpus_per_process = 2}).devices() == gpus({2, 3}));
  REQUIRE_THROWS_AS(DistributedState(vars("two"), fake_gpus(4)), accel::config_error);
  REQUIRE_THROWS_WITH(DistributedState(vars("two"), fake_gpus(4)),
                      "[accel.config] ACCEL_GPUS_PER_PROCESS='two' is not a positive integer; fix or unset ACCEL_GPUS_PER_PROCESS");
  REQUIRE_THROWS_WITH(DistributedState(vars("0"), fake_gpus(4)),
                      "[accel.config] ACCEL_GPUS_PER_PROCESS='0' is not a positive integer; fix or unset ACCEL_GPUS_PER_PROCESS");
  REQUIRE_THROWS_WITH(DistributedState(vars("-2"), fake_gpus(4)), accel_test::contains("ACCEL_GPUS_PER_PROCESS='-2'"));
  REQUIRE_THROWS_WITH(DistributedState(vars(""), fake_gpus(4)), accel_test::contains("ACCEL_GPUS_PER_PROCESS=''"));
  REQUIRE_THROWS_AS(DistributedState(vars("2"), fake_gpus(4), {.gpus_per_process = -1}), accel::usage_error);
}

TEST_CASE("on the CPU K is ignored: the only device is the CPU", "[state][groups]") {
  auto log = std::make_shared<accel_test::FakeDeviceLog>();
  const DistributedState a(accel::map_env(torchrun_vars(1, 2, 2)), fake_gpus(4, 80ull << 30, log), {.cpu = true, .gpus_per_process = 2});
  CHECK(a.devices() == std::vector<Device>{Device::cpu()});
  CHECK(a.physical_gpus().empty());
  CHECK(a.physical_gpu().empty());
  CHECK(a.to_string() == "process=1/2 local=1/2 device=cpu");
  const DistributedState b(accel::map_env(with(torchrun_vars(1, 2, 2), {{"ACCEL_USE_CPU", "1"}, {"ACCEL_GPUS_PER_PROCESS", "4"}})),
                           fake_gpus(4, 80ull << 30, log));
  CHECK(b.devices() == std::vector<Device>{Device::cpu()});
  CHECK(log->made_current.empty());
  const DistributedState c(accel::map_env(torchrun_vars(1, 2, 2)), accel_test::no_driver(), {.gpus_per_process = 8});
  CHECK(c.devices() == std::vector<Device>{Device::cpu()});
}

TEST_CASE("choose_devices is the rule as a pure function", "[state][groups]") {
  const auto env = accel_test::read(torchrun_vars(1, 2, 2));
  const accel::VisibleDevices unset;
  CHECK(accel::choose_devices(env, 7, unset, {}, 3) == gpus({3, 4, 5}));
  CHECK(accel::choose_devices(env, 3, unset, {}, 3) == gpus({0, 1, 2}));  // per-task binding
  CHECK(accel::choose_devices(env, 4, unset, {}, 1) == gpus({1}));
  CHECK(accel::choose_devices(env, 1, unset, {}, 1) == gpus({0}));
  CHECK(accel::choose_devices(env, 0, unset, {}, 3) == std::vector<Device>{Device::cpu()});
  REQUIRE_THROWS_AS(accel::choose_devices(env, 5, unset, {}, 3), accel::config_error);
  REQUIRE_THROWS_AS(accel::choose_devices(env, 4, unset, {}, 0), accel::usage_error);
}
