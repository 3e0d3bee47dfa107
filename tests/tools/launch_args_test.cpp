// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel launch`'s command line: the options on the shared parser, the program, and the help text.
#include "../tools/commands/launch.hpp"

#include <string>
#include <string_view>
#include <vector>

#include "support/catch.hpp"

using accel_cli::LaunchCommandLine;
using accel_test::contains;

namespace {

LaunchCommandLine parse(std::vector<std::string_view> args) {
  args.insert(args.begin(), "launch");
  return accel_cli::parse_launch_args(std::span<const std::string_view>(args));
}

}  // namespace

TEST_CASE("launch arguments accept underscore and hyphen spellings and the opt=value form", "[launch][args]") {
  const auto a = parse({"--num_processes", "4", "--gpu-ids", "2,5", "--tee", "--log_dir=logs", "--timeout", "12.5", "--grace",
                        "0", "./prog", "--num_processes", "9"}).options;
  CHECK(a.num_processes == 4);
  CHECK(a.gpu_ids == std::optional<std::string>("2,5"));
  CHECK(a.tee);
  CHECK(a.log_dir == std::optional<std::string>("logs"));
  CHECK(a.timeout_s == "12.5");
  CHECK(a.grace_s == 0.0);
  // Everything from the program on belongs to the program, options included.
  CHECK(a.command == std::vector<std::string>{"./prog", "--num_processes", "9"});

  const auto b = parse({"--num-processes=3", "--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "10.0.0.1",
                        "--main-process-port", "29500", "--cpu", "--", "-weird-name", "x"}).options;
  CHECK(b.num_processes == 3);
  CHECK(b.num_machines == 2);
  CHECK(b.machine_rank == 1);
  CHECK(b.main_process_ip == std::optional<std::string>("10.0.0.1"));
  CHECK(b.main_process_port == 29500);
  CHECK(b.cpu);
  CHECK(b.command == std::vector<std::string>{"-weird-name", "x"});
}

TEST_CASE("launch arguments read --gpus_per_process in both spellings and check it", "[launch][args]") {
  CHECK(parse({"--gpus_per_process", "2", "prog"}).options.gpus_per_process == 2);
  CHECK(parse({"--gpus-per-process=4", "prog"}).options.gpus_per_process == 4);
  CHECK_FALSE(parse({"prog"}).options.gpus_per_process);
  REQUIRE_THROWS_AS(parse({"--gpus_per_process", "0", "prog"}), accel::usage_error);
  REQUIRE_THROWS_WITH(parse({"--gpus_per_process", "0", "prog"}), contains("--gpus_per_process '0' is not a positive integer"));
  REQUIRE_THROWS_WITH(parse({"--gpus-per-process", "two", "prog"}), contains("--gpus-per-process 'two' is not a positive integer"));
}

TEST_CASE("launch arguments have documented defaults", "[launch][args]") {
  const auto a = parse({"prog"}).options;
  CHECK_FALSE(a.num_processes);
  CHECK_FALSE(a.gpu_ids);
  CHECK_FALSE(a.cpu);
  CHECK(a.num_machines == 1);
  CHECK_FALSE(a.machine_rank);
  CHECK_FALSE(a.main_process_port);
  CHECK_FALSE(a.tee);
  CHECK(a.timeout_s == "300");
  CHECK(a.grace_s == 10.0);
  CHECK_FALSE(parse({"--gpu_ids", "all", "prog"}).options.gpu_ids);
  CHECK(parse({"--help"}).help);
  CHECK(parse({"-h"}).help);
  CHECK_FALSE(parse({"prog"}).help);
}

TEST_CASE("a launch option given again replaces the earlier one", "[launch][args]") {
  CHECK(parse({"--num_processes", "2", "--num-processes=3", "prog"}).options.num_processes == 3);
  CHECK_FALSE(parse({"--gpu_ids", "2,5", "--gpu_ids", "all", "prog"}).options.gpu_ids);
  CHECK(parse({"--gpu_ids", "all", "--gpu_ids", "1", "prog"}).options.gpu_ids == std::optional<std::string>("1"));
  // Each value is still checked, also one that a later option replaces.
  REQUIRE_THROWS_WITH(parse({"--main_process_ip", "", "--main_process_ip", "h", "prog"}),
                      contains("--main_process_ip '' is not a host name"));
}

TEST_CASE("launch arguments reject a missing value naming the option", "[launch][args]") {
  REQUIRE_THROWS_AS(parse({"--num_processes"}), accel::usage_error);
  REQUIRE_THROWS_WITH(parse({"--num_processes"}), contains("--num_processes needs a value"));
  REQUIRE_THROWS_WITH(parse({"--gpu-ids", "--", "prog"}), contains("--gpu-ids needs a value"));
  REQUIRE_THROWS_WITH(parse({"--log_dir=", "prog"}), contains("--log_dir needs a directory name"));
}

TEST_CASE("launch arguments reject bad numbers naming the value", "[launch][args]") {
  REQUIRE_THROWS_WITH(parse({"--num_processes", "abc", "prog"}), contains("--num_processes 'abc' is not a positive integer"));
  REQUIRE_THROWS_WITH(parse({"--num_processes", "0", "prog"}), contains("--num_processes '0' is not a positive integer"));
  REQUIRE_THROWS_WITH(parse({"--num_processes", "-2", "prog"}), contains("--num_processes '-2'"));
  REQUIRE_THROWS_WITH(parse({"--num-machines=2x", "prog"}), contains("--num-machines '2x' is not a positive integer"));
  REQUIRE_THROWS_WITH(parse({"--main_process_port", "70000", "prog"}), contains("--main_process_port '70000' is not a non-negative integer up to 65535"));
  REQUIRE_THROWS_WITH(parse({"--timeout", "0", "prog"}), contains("--timeout '0' is not a positive number of seconds"));
  REQUIRE_THROWS_WITH(parse({"--timeout", "inf", "prog"}), contains("--timeout 'inf'"));
  REQUIRE_THROWS_WITH(parse({"--grace", "-1", "prog"}), contains("--grace '-1' is not a non-negative number of seconds"));
  REQUIRE_THROWS_WITH(parse({"--main_process_ip", "", "prog"}), contains("--main_process_ip '' is not a host name"));
}

TEST_CASE("launch arguments reject unknown options and flags with values and a missing program", "[launch][args]") {
  REQUIRE_THROWS_WITH(parse({"--num_procs", "2", "prog"}), contains("unknown option '--num_procs'; see accel launch --help"));
  REQUIRE_THROWS_WITH(parse({"-n", "2", "prog"}), contains("unknown option '-n'"));
  REQUIRE_THROWS_WITH(parse({"--multi_gpu", "prog"}), contains("accel launch needs no --multi_gpu"));
  REQUIRE_THROWS_WITH(parse({"--tee=1", "prog"}), contains("--tee takes no value"));
  REQUIRE_THROWS_WITH(parse({"--num_processes", "2"}), contains("no program to launch"));
  REQUIRE_THROWS_WITH(parse({"--num_processes", "2", "--"}), contains("no program to launch"));
  REQUIRE_THROWS_WITH(parse({"--cpu", "--gpu_ids", "1", "prog"}), contains("--cpu and --gpu_ids 1 contradict"));
}

TEST_CASE("launch's help names every option it accepts", "[launch][args]") {
  const std::string help = accel_cli::launch_help;
  for (const auto& spec : accel_cli::launch_options) {
    if (!spec.refused.empty()) continue;
    std::string name(spec.name);
    std::replace(name.begin(), name.end(), '-', '_');
    CHECK_THAT(help, contains("  --" + name + " "));
  }
}
