// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// accel launch decisions: the per-rank plan, the GPU checklist, wait statuses (the command line is
// tested with the accel tool, tests/tools/launch_args_test.cpp).
#include <accel/launch/launch_plan.hpp>
#include <accel/launch/run.hpp>
#include <accel/runtime/env.hpp>
#include <accel/state.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using accel::launch::LaunchInputs;
using accel::launch::LaunchOptions;
using accel::launch::LaunchPlan;
using accel_test::contains;

namespace {

LaunchInputs gpus(int count, std::optional<std::string> visible = std::nullopt) {
  LaunchInputs in;
  in.gpu_count = count;
  in.gpu_status = count == 0 ? "insufficient driver" : "";
  in.cuda_visible_devices = std::move(visible);
  in.free_port = 41234;
  in.fresh_job_token = "00112233445566778899aabbccddeeff";
  return in;
}

LaunchPlan plan(LaunchOptions options, const LaunchInputs& in) {
  options.command = {"./prog"};
  return accel::launch::plan_launch(options, in);
}

bool has_warning(const LaunchPlan& p, const std::string& needle) {
  for (const auto& w : p.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("the plan gives every rank the documented environment", "[launch][plan]") {
  const auto p = plan({.num_processes = 2, .cpu = true, .timeout_s = "42"}, gpus(0));
  REQUIRE(p.ranks.size() == 2);
  CHECK(p.world_size == 2);
  CHECK(p.local_world_size == 2);
  for (int r = 0; r < 2; ++r) {
    const auto& e = p.ranks[static_cast<std::size_t>(r)].env;
    CHECK(p.ranks[static_cast<std::size_t>(r)].rank == r);
    CHECK(e.at("RANK") == std::to_string(r));
    CHECK(e.at("LOCAL_RANK") == std::to_string(r));
    CHECK(e.at("WORLD_SIZE") == "2");
    CHECK(e.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(e.at("GROUP_RANK") == "0");
    CHECK(e.at("GROUP_WORLD_SIZE") == "1");
    CHECK(e.at("MASTER_ADDR") == "127.0.0.1");
    CHECK(e.at("MASTER_PORT") == "41234");
    CHECK(e.at("ACCEL_LAUNCHED") == "1");
    CHECK(e.at("ACCEL_JOB_TOKEN") == "00112233445566778899aabbccddeeff");
    CHECK(e.at("ACCEL_TIMEOUT_S") == "42");
    CHECK(e.at("ACCEL_USE_CPU") == "1");
    CHECK(e.count("CUDA_VISIBLE_DEVICES") == 0);
    CHECK(e.count("ACCEL_STORE") == 0);
  }
  CHECK(p.warnings.empty());
}

TEST_CASE("the planned environment reads back through read_launch_env as accel launch", "[launch][plan]") {
  auto p = plan({.num_processes = 3, .cpu = true}, gpus(0));
  accel::launch::set_store_address(p, "127.0.0.1:5000");
  const auto env = accel::read_launch_env(accel::map_env(p.ranks[2].env));
  CHECK(env.launcher == accel::Launcher::accel);
  CHECK(env.rank == 2);
  CHECK(env.world_size == 3);
  CHECK(env.local_rank == 2);
  CHECK(env.num_machines == 1);
  CHECK(env.store_address == std::optional<std::string>("127.0.0.1:5000"));
  CHECK(env.job_token == "00112233445566778899aabbccddeeff");
  CHECK(env.use_cpu);
}

TEST_CASE("the process count defaults to the visible GPU count and to 1 without GPUs", "[launch][plan]") {
  CHECK(plan({}, gpus(4)).local_world_size == 4);
  CHECK(plan({}, gpus(0)).local_world_size == 1);
  CHECK(plan({.cpu = true}, gpus(8)).local_world_size == 1);
  CHECK(plan({}, gpus(2, "2,5")).local_world_size == 2);
  CHECK(plan({.gpu_ids = "1,2,3"}, gpus(4)).local_world_size == 3);
}

TEST_CASE("a free port is used unless --main_process_port names one", "[launch][plan]") {
  CHECK(plan({.cpu = true}, gpus(0)).master_port == 41234);
  CHECK(plan({.cpu = true, .main_process_port = 0}, gpus(0)).master_port == 41234);
  const auto p = plan({.cpu = true, .main_process_ip = "node7", .main_process_port = 29500}, gpus(0));
  CHECK(p.master_port == 29500);
  CHECK(p.ranks[0].env.at("MASTER_ADDR") == "node7");
}

TEST_CASE("gpu_ids becomes the children's CUDA_VISIBLE_DEVICES", "[launch][plan][gpus]") {
  const auto p = plan({.gpu_ids = "2,5"}, gpus(8));
  REQUIRE(p.ranks.size() == 2);
  CHECK(p.ranks[0].env.at("CUDA_VISIBLE_DEVICES") == "2,5");
  CHECK(p.ranks[1].env.at("CUDA_VISIBLE_DEVICES") == "2,5");
  CHECK(p.warnings.empty());
  // Whitespace is normalised the way the driver reads the list.
  CHECK(plan({.gpu_ids = "2, 5"}, gpus(8)).ranks[0].env.at("CUDA_VISIBLE_DEVICES") == "2,5");
  const auto uuids = plan({.gpu_ids = "GPU-aaaa,GPU-bbbb"}, gpus(8));
  CHECK(uuids.ranks[1].env.at("CUDA_VISIBLE_DEVICES") == "GPU-aaaa,GPU-bbbb");
}

TEST_CASE("gpu_ids that replace an inherited CUDA_VISIBLE_DEVICES say so", "[launch][plan][gpus]") {
  const auto p = plan({.gpu_ids = "1"}, gpus(2, "0,1"));
  CHECK(has_warning(p, "--gpu_ids 1 replaces CUDA_VISIBLE_DEVICES='0,1' for the children"));
}

TEST_CASE("gpu_ids on a machine without a visible GPU warn that they cannot be checked", "[launch][plan][gpus]") {
  const auto p = plan({.gpu_ids = "2,5"}, gpus(0));
  CHECK(p.local_world_size == 2);
  CHECK(has_warning(p, "cannot check --gpu_ids 2,5: the launcher sees no GPU (insufficient driver)"));
}

TEST_CASE("bad gpu_ids lists are usage errors with the fix", "[launch][plan][gpus]") {
  REQUIRE_THROWS_AS(plan({.gpu_ids = ""}, gpus(4)), accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.gpu_ids = ""}, gpus(4)), contains("--gpu_ids '' names no GPU"));
  REQUIRE_THROWS_WITH(plan({.gpu_ids = "1,1"}, gpus(4)), contains("--gpu_ids 1,1 lists a GPU twice"));
  REQUIRE_THROWS_WITH(plan({.gpu_ids = "0,-1"}, gpus(4)), contains("entry '-1' is negative"));
  REQUIRE_THROWS_AS(plan({.gpu_ids = "0,7"}, gpus(4)), accel::config_error);
  REQUIRE_THROWS_WITH(plan({.gpu_ids = "0,7"}, gpus(4)), contains("names GPU 7, but this machine has 4 GPUs (0-3)"));
}

TEST_CASE("an empty CUDA_VISIBLE_DEVICES is a config error with the fix", "[launch][plan][gpus]") {
  REQUIRE_THROWS_AS(plan({}, gpus(0, "")), accel::config_error);
  REQUIRE_THROWS_WITH(plan({}, gpus(0, "")), contains("CUDA_VISIBLE_DEVICES is set to '', so no GPU is visible; unset it"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2}, gpus(0, " ")), contains("or pass --cpu to run on the CPU"));
  // --cpu and --gpu_ids both make the inherited value irrelevant.
  CHECK_NOTHROW(plan({.cpu = true}, gpus(0, "")));
  CHECK(has_warning(plan({.gpu_ids = "0"}, gpus(0, "")), "replaces CUDA_VISIBLE_DEVICES=''"));
}

TEST_CASE("a duplicated CUDA_VISIBLE_DEVICES is a config error with the fix", "[launch][plan][gpus]") {
  REQUIRE_THROWS_AS(plan({}, gpus(0, "0,1,0")), accel::config_error);
  REQUIRE_THROWS_WITH(plan({}, gpus(0, "0,1,0")), contains("GPU '0' is listed twice"));
  REQUIRE_THROWS_WITH(plan({}, gpus(0, "0,1,0")), contains("or choose GPUs with --gpu_ids"));
}

TEST_CASE("fewer visible GPUs than processes is an error naming both counts", "[launch][plan][gpus]") {
  REQUIRE_THROWS_AS(plan({.num_processes = 3}, gpus(2, "2,5")), accel::config_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 3}, gpus(2, "2,5")),
                      contains("3 processes but only 2 GPUs visible (CUDA_VISIBLE_DEVICES='2,5'): each process needs its own GPU; "
                               "pass --num_processes 2"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2}, gpus(1)), contains("2 processes but only 1 GPU visible (1 GPU on this machine)"))
                            ;
  REQUIRE_THROWS_AS(plan({.num_processes = 3, .gpu_ids = "4,6"}, gpus(8)), accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 3, .gpu_ids = "4,6"}, gpus(8)),
                      contains("3 processes but --gpu_ids 4,6 lists only 2 GPUs"));
}

TEST_CASE("more visible GPUs than processes warns naming the unused ones", "[launch][plan][gpus]") {
  const auto p = plan({.num_processes = 2}, gpus(4));
  CHECK(p.local_world_size == 2);
  CHECK(has_warning(p, "4 GPUs visible (4 GPUs on this machine) but 2 processes: GPUs 2,3 stay unused; pass --num_processes 4"));
  const auto q = plan({.num_processes = 1}, gpus(2, "3,7"));
  CHECK(has_warning(q, "GPU 7 stays unused"));
  const auto r = plan({.num_processes = 1, .gpu_ids = "4,6"}, gpus(8));
  CHECK(has_warning(r, "GPU 6 stays unused"));
  CHECK(plan({.num_processes = 4}, gpus(4)).warnings.empty());
}

TEST_CASE("no visible GPU without --cpu warns that processes run on the CPU", "[launch][plan][gpus]") {
  const auto p = plan({.num_processes = 2}, gpus(0));
  CHECK(p.local_world_size == 2);
  CHECK(has_warning(p, "no GPU is visible (insufficient driver): every process runs on the CPU; pass --cpu"));
  CHECK(plan({.num_processes = 2, .cpu = true}, gpus(0)).warnings.empty());
}

TEST_CASE("CUDA_VISIBLE_DEVICES whitespace and truncation become warnings", "[launch][plan][gpus]") {
  const auto p = plan({}, gpus(2, "0, 1,abc"));
  CHECK(has_warning(p, "CUDA_VISIBLE_DEVICES: entry ' 1' has whitespace around it"));
  CHECK(has_warning(p, "entry 'abc' is not a GPU index"));
}

TEST_CASE("several machines: num_processes counts all of them and ranks follow the machine", "[launch][plan][machines]") {
  LaunchInputs in = gpus(0);
  in.env_job_token = "feedfacefeedfacefeedfacefeedface";
  const auto p = plan({.num_processes = 6, .cpu = true, .num_machines = 3,
                       .machine_rank = 2, .main_process_ip = "10.0.0.1", .main_process_port = 29500},
                      in);
  CHECK(p.world_size == 6);
  CHECK(p.local_world_size == 2);
  REQUIRE(p.ranks.size() == 2);
  CHECK(p.ranks[0].rank == 4);
  CHECK(p.ranks[1].rank == 5);
  const auto& e = p.ranks[1].env;
  CHECK(e.at("RANK") == "5");
  CHECK(e.at("LOCAL_RANK") == "1");
  CHECK(e.at("WORLD_SIZE") == "6");
  CHECK(e.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(e.at("GROUP_RANK") == "2");
  CHECK(e.at("GROUP_WORLD_SIZE") == "3");
  CHECK(e.at("MASTER_ADDR") == "10.0.0.1");
  CHECK(e.at("MASTER_PORT") == "29500");
  CHECK(e.at("ACCEL_JOB_TOKEN") == "feedfacefeedfacefeedfacefeedface");
  const auto env = accel::read_launch_env(accel::map_env(e));
  CHECK(env.group_rank == 2);
  CHECK(env.num_machines == 3);
  // With GPUs and no --cpu the count per machine is checked against this machine's GPUs.
  LaunchInputs g = gpus(4);
  g.env_job_token = "t";
  const auto q = plan({.num_processes = 8, .num_machines = 2, .machine_rank = 1, .main_process_ip = "h", .main_process_port = 1},
                      g);
  CHECK(q.world_size == 8);
  CHECK(q.ranks.front().rank == 4);
  CHECK(q.warnings.empty());
  REQUIRE_THROWS_WITH(plan({.num_processes = 10, .num_machines = 2,
                            .machine_rank = 1, .main_process_ip = "h", .main_process_port = 1},
                           g),
                      contains("5 processes per machine but only 4 GPUs visible (4 GPUs on this machine): each process needs its "
                               "own GPU; pass --num_processes 8"));
}

TEST_CASE("several machines: a total that does not divide is rejected and not truncated", "[launch][plan][machines]") {
  LaunchInputs in = gpus(0);
  in.env_job_token = "t";
  REQUIRE_THROWS_AS(plan({.num_processes = 5, .cpu = true, .num_machines = 2,
                          .machine_rank = 0, .main_process_ip = "h", .main_process_port = 1},
                         in),
                    accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 5, .cpu = true, .num_machines = 2,
                            .machine_rank = 0, .main_process_ip = "h", .main_process_port = 1},
                           in),
                      contains("--num_processes 5 is not divisible by --num_machines 2: --num_processes counts the processes of "
                               "all machines together; use a multiple of 2 (4 or 6)"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 1, .cpu = true, .num_machines = 2,
                            .machine_rank = 0, .main_process_ip = "h", .main_process_port = 1},
                           in),
                      contains("use a multiple of 2 (2)"));
}

TEST_CASE("several machines: the rendezvous options are required", "[launch][plan][machines]") {
  LaunchInputs in = gpus(0);
  in.env_job_token = "t";
  REQUIRE_THROWS_WITH(plan({.cpu = true, .num_machines = 2,
                            .machine_rank = 0, .main_process_ip = "h", .main_process_port = 1}, in),
                      contains("--num_machines 2 needs --num_processes (the total over all machines)"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .cpu = true, .num_machines = 2,
                            .main_process_ip = "h", .main_process_port = 1}, in),
                      contains("--num_machines 2 needs --machine_rank (0 to 1)"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .cpu = true, .num_machines = 2,
                            .machine_rank = 2, .main_process_ip = "h", .main_process_port = 1}, in),
                      contains("--machine_rank 2 is not below --num_machines 2"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .cpu = true, .num_machines = 2, .machine_rank = 1, .main_process_port = 1}, in),
                      contains("needs --main_process_ip"));
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .cpu = true, .num_machines = 2, .machine_rank = 1, .main_process_ip = "h"}, in),
                      contains("needs --main_process_port"));
  REQUIRE_THROWS_WITH(plan({.cpu = true, .machine_rank = 1}, in), contains("--machine_rank 1 needs --num_machines above 1"));
  REQUIRE_THROWS_AS(plan({.num_processes = 2, .cpu = true, .num_machines = 2,
                          .machine_rank = 1, .main_process_ip = "h", .main_process_port = 1},
                         gpus(0)),
                    accel::config_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .cpu = true, .num_machines = 2,
                            .machine_rank = 1, .main_process_ip = "h", .main_process_port = 1},
                           gpus(0)),
                      contains("needs the same ACCEL_JOB_TOKEN on every machine"));
}

TEST_CASE("one machine ignores an inherited ACCEL_JOB_TOKEN and uses a fresh one", "[launch][plan]") {
  LaunchInputs in = gpus(0);
  in.env_job_token = "stale";
  CHECK(plan({.cpu = true}, in).ranks[0].env.at("ACCEL_JOB_TOKEN") == "00112233445566778899aabbccddeeff");
}

TEST_CASE("the child environment drops other launchers' rank variables and overrides inherited ones", "[launch][plan]") {
  auto p = plan({.num_processes = 2, .cpu = true}, gpus(0));
  const std::vector<std::string> parent = {"PATH=/bin", "RANK=7", "SLURM_PROCID=3", "OMPI_COMM_WORLD_RANK=1",
                                           "ACCEL_STORE=old:1", "HOME=/root", "EMPTY=", "WEIRD=a=b"};
  const auto env = accel::launch::child_environment(p, p.ranks[1], parent);
  auto count = [&](const std::string& e) { return std::count(env.begin(), env.end(), e); };
  CHECK(count("PATH=/bin") == 1);
  CHECK(count("HOME=/root") == 1);
  CHECK(count("EMPTY=") == 1);
  CHECK(count("WEIRD=a=b") == 1);
  CHECK(count("RANK=1") == 1);
  CHECK(count("RANK=7") == 0);
  CHECK(count("SLURM_PROCID=3") == 0);
  CHECK(count("OMPI_COMM_WORLD_RANK=1") == 0);
  CHECK(count("ACCEL_STORE=old:1") == 0);
  accel::launch::set_store_address(p, "127.0.0.1:9");
  CHECK(std::count(p.ranks[0].env.begin(), p.ranks[0].env.end(), std::pair<const std::string, std::string>("ACCEL_STORE", "127.0.0.1:9")) == 1);
}

TEST_CASE("gpus_per_process sets ACCEL_GPUS_PER_PROCESS for every child, whose state owns its group", "[launch][plan][groups]") {
  const auto p = plan({.gpus_per_process = 2}, gpus(8, "0,1,2,3,4,5,6,7"));
  REQUIRE(p.ranks.size() == 4);
  for (const auto& r : p.ranks) CHECK(r.env.at("ACCEL_GPUS_PER_PROCESS") == "2");
  CHECK(p.warnings.empty());
  // What the children do with it: local rank 3 owns GPUs 6 and 7.
  const accel::DistributedState s(accel::map_env(p.ranks[3].env), accel_test::fake_gpus(8), {.make_current = false, .join_job = false});
  CHECK(s.devices() == std::vector<accel::Device>{accel::Device::cuda(6), accel::Device::cuda(7)});
  CHECK(s.physical_gpus() == std::vector<std::string>{"6", "7"});
  // Without the option nothing is set: the children inherit what the launcher has.
  CHECK(plan({}, gpus(4)).ranks[0].env.count("ACCEL_GPUS_PER_PROCESS") == 0);
  CHECK(plan({.gpus_per_process = 1}, gpus(4)).ranks[0].env.at("ACCEL_GPUS_PER_PROCESS") == "1");
}

TEST_CASE("with K GPUs per process the default process count is visible GPUs / K", "[launch][plan][groups]") {
  CHECK(plan({.gpus_per_process = 2}, gpus(8)).local_world_size == 4);
  CHECK(plan({.gpus_per_process = 4}, gpus(8)).local_world_size == 2);
  CHECK(plan({.gpus_per_process = 2}, gpus(4, "2,5,6,7")).local_world_size == 2);
  CHECK(plan({.gpu_ids = "1,2,3,4", .gpus_per_process = 2}, gpus(8)).local_world_size == 2);
  CHECK(plan({.gpus_per_process = 1}, gpus(8)).local_world_size == 8);
  // A remainder stays unused, and the warning says why.
  const auto p = plan({.gpus_per_process = 3}, gpus(8));
  CHECK(p.local_world_size == 2);
  CHECK(has_warning(p, "8 GPUs visible (8 GPUs on this machine) but 2 processes with 3 GPUs each: GPUs 6,7 stay unused; "
                       "8 GPUs do not divide into groups of 3; choose a multiple of 3 GPUs with --gpu_ids"));
  const auto q = plan({.num_processes = 1, .gpus_per_process = 2}, gpus(4, "0,2,5,7"));
  CHECK(has_warning(q, "but 1 process with 2 GPUs each: GPUs 5,7 stay unused; pass --num_processes 2 to use every GPU"));
  // Without a visible GPU nothing can be counted: one process (on the CPU), with the usual warning.
  CHECK(plan({.gpus_per_process = 2}, gpus(0)).local_world_size == 1);
}

TEST_CASE("the launcher's own ACCEL_GPUS_PER_PROCESS is counted and checked", "[launch][plan][groups]") {
  LaunchInputs in = gpus(8);
  in.env_gpus_per_process = "4";
  const auto p = plan({}, in);
  CHECK(p.local_world_size == 2);
  CHECK(p.ranks[0].env.count("ACCEL_GPUS_PER_PROCESS") == 0);  // inherited as it is
  CHECK(plan({.gpus_per_process = 2}, in).local_world_size == 4);  // the option wins
  in.env_gpus_per_process = "0";
  REQUIRE_THROWS_AS(plan({}, in), accel::config_error);
  REQUIRE_THROWS_WITH(plan({}, in), contains("ACCEL_GPUS_PER_PROCESS='0' is not a positive integer; fix or unset ACCEL_GPUS_PER_PROCESS"));
  in.env_gpus_per_process = "2x";
  REQUIRE_THROWS_WITH(plan({.cpu = true}, in), contains("ACCEL_GPUS_PER_PROCESS='2x'"));
}

TEST_CASE("fewer visible GPUs than processes x K is an error naming K and the counts", "[launch][plan][groups]") {
  REQUIRE_THROWS_AS(plan({.num_processes = 3, .gpus_per_process = 2}, gpus(4, "0,1,2,3")), accel::config_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 3, .gpus_per_process = 2}, gpus(4, "0,1,2,3")),
                      "[accel.config] 3 processes with 2 GPUs each need 6 GPUs but only 4 GPUs visible "
                      "(CUDA_VISIBLE_DEVICES='0,1,2,3'): each process needs 2 GPUs of its own; pass --num_processes 2, "
                      "pass --gpus_per_process 1, choose more GPUs with --gpu_ids, or run on the CPU with --cpu and no "
                      "--gpus_per_process");
  // The default count cannot go below one process: too few GPUs for one group.
  REQUIRE_THROWS_WITH(plan({.gpus_per_process = 4}, gpus(2)),
                      "[accel.config] 1 process with 4 GPUs each needs 4 GPUs but only 2 GPUs visible (2 GPUs on this machine): "
                      "each process needs 4 GPUs of its own; pass --gpus_per_process 2, choose more GPUs with --gpu_ids, or run "
                      "on the CPU with --cpu and no --gpus_per_process");
  REQUIRE_THROWS_AS(plan({.num_processes = 2, .gpu_ids = "4,5,6", .gpus_per_process = 2}, gpus(8)), accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.num_processes = 2, .gpu_ids = "4,5,6", .gpus_per_process = 2}, gpus(8)),
                      contains("2 processes with 2 GPUs each need 4 GPUs but --gpu_ids 4,5,6 lists only 3 GPUs: each process needs "
                               "2 GPUs of its own; pass --num_processes 1, pass --gpus_per_process 1, list more GPUs with --gpu_ids"));
  LaunchInputs g = gpus(4);
  g.env_job_token = "t";
  REQUIRE_THROWS_WITH(plan({.num_processes = 6, .gpus_per_process = 2, .num_machines = 2, .machine_rank = 1,
                            .main_process_ip = "h", .main_process_port = 1},
                           g),
                      contains("3 processes per machine with 2 GPUs each need 6 GPUs but only 4 GPUs visible (4 GPUs on this "
                               "machine): each process needs 2 GPUs of its own; pass --num_processes 4,"));
}

TEST_CASE("gpus_per_process must be positive and contradicts --cpu above 1", "[launch][plan][groups]") {
  REQUIRE_THROWS_AS(plan({.cpu = true, .gpus_per_process = 2}, gpus(0)), accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.cpu = true, .gpus_per_process = 2}, gpus(0)),
                      "[accel.usage] --cpu and --gpus_per_process 2 contradict each other: a process on the CPU owns no GPU; "
                      "pass one of them");
  CHECK(plan({.num_processes = 2, .cpu = true, .gpus_per_process = 1}, gpus(0)).local_world_size == 2);
  REQUIRE_THROWS_AS(plan({.gpus_per_process = 0}, gpus(4)), accel::usage_error);
  REQUIRE_THROWS_WITH(plan({.gpus_per_process = -3}, gpus(4)), contains("--gpus_per_process -3 is not a positive integer"));
}

TEST_CASE("wait statuses are described and mapped to shell exit codes", "[launch][status]") {
  const int exited3 = 3 << 8;
  const int killed_segv = SIGSEGV;
  const int killed_kill = SIGKILL;
  CHECK(accel::detail::proc::describe_wait_status(exited3) == "exited with code 3");
  CHECK(accel::detail::proc::exit_code_of(exited3) == 3);
  CHECK(accel::detail::proc::describe_wait_status(killed_segv) == "was killed by signal 11 (SIGSEGV)");
  CHECK(accel::detail::proc::exit_code_of(killed_segv) == 139);
  CHECK(accel::detail::proc::describe_wait_status(killed_kill) == "was killed by signal 9 (SIGKILL)");
  CHECK(accel::detail::proc::exit_code_of(killed_kill) == 137);
  CHECK(accel::detail::proc::succeeded(0));
  CHECK_FALSE(accel::detail::proc::succeeded(exited3));
  CHECK(accel::detail::proc::signal_name(SIGTERM) == "SIGTERM");
  CHECK(accel::detail::proc::signal_name(63) == "signal 63");
}

TEST_CASE("output is cut into whole lines and partial lines wait for their end", "[launch][lines]") {
  accel::launch::detail::LineSplitter s(8);
  std::vector<std::string> out;
  auto emit = [&](std::string_view l) { out.emplace_back(l); };
  s.feed("ab", emit);
  CHECK(out.empty());
  s.feed("c\nde\n\nf", emit);
  CHECK(out == std::vector<std::string>{"abc", "de", ""});
  s.feed("ghijklmnop", emit);  // "fghijklmnop": longer than 8, emitted in pieces
  CHECK(out.back() == "fghijklm");
  s.finish(emit);
  CHECK(out.back() == "nop");
  s.finish(emit);
  CHECK(out.size() == 5);
}

TEST_CASE("lines far longer than one read stay whole up to 16 MiB", "[launch][lines]") {
  accel::launch::detail::LineSplitter s;
  std::vector<std::string> out;
  auto emit = [&](std::string_view l) { out.emplace_back(l); };
  const std::string line(3 << 20, 'x');
  for (std::size_t at = 0; at < line.size(); at += 64 * 1024) s.feed(std::string_view(line).substr(at, 64 * 1024), emit);
  CHECK(out.empty());
  s.feed("\nnext", emit);
  REQUIRE(out.size() == 1);
  CHECK(out[0] == line);
  s.finish(emit);
  CHECK(out.back() == "next");
  const std::string endless(accel::launch::detail::LineSplitter::default_max_line + 5, 'y');
  s.feed(endless, emit);  // past the bound: one piece of 16 MiB now, the rest waits for its end
  REQUIRE(out.size() == 3);
  CHECK(out[2].size() == accel::launch::detail::LineSplitter::default_max_line);
  s.finish(emit);
  CHECK(out.back() == "yyyyy");
}

TEST_CASE("process table lines are read even when the command name holds spaces and parentheses", "[launch][spawn]") {
  accel::detail::proc::ProcessEntry e;
  pid_t ppid = 0;
  REQUIRE(accel::detail::proc::parse_proc_stat("4242 (my (odd) name) S 17 4242 4242 0 -1 4194560", e, ppid));
  CHECK(e.pid == 4242);
  CHECK(e.name == "my (odd) name");
  CHECK(e.state == 'S');
  CHECK(ppid == 17);
  CHECK(e.pgid == 4242);
  REQUIRE(accel::detail::proc::parse_proc_stat("7 (sleep) Z 1 6 6", e, ppid));
  CHECK(e.state == 'Z');
  CHECK_FALSE(accel::detail::proc::parse_proc_stat("7 sleep Z 1 6 6", e, ppid));
  CHECK_FALSE(accel::detail::proc::parse_proc_stat("", e, ppid));
  // This test process is a child of something, and is not its own child.
  const auto mine = accel::detail::proc::children_of(::getppid());
  CHECK(std::any_of(mine.begin(), mine.end(), [](const auto& p) { return p.pid == ::getpid(); }));
  const auto none = accel::detail::proc::children_of(::getpid());
  CHECK(std::none_of(none.begin(), none.end(), [](const auto& p) { return p.pid == ::getpid(); }));
}

TEST_CASE("programs are found on PATH like execvp does", "[launch][spawn]") {
  CHECK(accel::detail::proc::find_program("sh", "/nonexistent:/bin:/usr/bin").ends_with("/sh"));
  CHECK(accel::detail::proc::find_program("sh", "/nonexistent").empty());
  CHECK(accel::detail::proc::find_program("/bin/sh", "") == "/bin/sh");
  CHECK(accel::detail::proc::find_program("./no-such-program", "/bin").empty());
  CHECK(accel::detail::proc::find_program("", "/bin").empty());
}

TEST_CASE("random job tokens are 128 bits of hex and differ", "[launch][spawn]") {
  const auto a = accel::detail::proc::random_hex(16);
  const auto b = accel::detail::proc::random_hex(16);
  CHECK(a.size() == 32);
  CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(a != b);
  const int port = accel::detail::proc::pick_free_port();
  CHECK(port > 0);
  CHECK(port <= 65535);
}
