// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The `accel` command: subcommand dispatch only; each subcommand lives in tools/commands/.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <string_view>

#include <accel/runtime/error.hpp>

#include "commands/env.hpp"
#include "commands/exit_codes.hpp"
#include "commands/launch.hpp"
#include "commands/load.hpp"
#include "commands/plan.hpp"
#include "commands/version.hpp"

namespace {

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(std::span<char*> args);  // args[0] is the subcommand name
};

// One row per subcommand; keep in the order `accel --help` shows them.
constexpr Command commands[] = {
    {"version", "print the accel version", accel_cli::run_version},
    {"launch", "start N processes with their rank environment and supervise them", accel_cli::run_launch},
    {"env", "print what this process sees: features, driver, GPUs, CUDA_VISIBLE_DEVICES, launcher", accel_cli::run_env},
    {"plan", "plan a device map (GPUs, cpu, disk) from checkpoint headers or a skeleton", accel_cli::run_plan},
    {"estimate-memory", "model size and largest layer per dtype, from headers only", accel_cli::run_estimate_memory},
    {"load", "validate and load a checkpoint onto GPUs/cpu/disk by device map; per-device totals and load rate", accel_cli::run_load},
};

void print_help(std::FILE* out) {
  std::fprintf(out, "usage: accel <command> [options]\n\ncommands:\n");
  for (const auto& c : commands)
    std::fprintf(out, "  %-17.*s %.*s\n", int(c.name.size()), c.name.data(), int(c.summary.size()), c.summary.data());
  std::fprintf(out, "\n`accel <command> --help` describes each command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::span<char*> args(argv, static_cast<std::size_t>(argc));
  if (args.size() < 2) {
    print_help(stderr);
    return accel_cli::exit_usage;
  }
  std::string_view name = args[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_help(stdout);
    return 0;
  }
  if (name == "--version") name = "version";
  for (const auto& c : commands) {
    if (c.name != name) continue;
    try {
      return c.run(args.subspan(1));
    } catch (const accel::error& e) {
      std::fprintf(stderr, "accel %s: %s\n", argv[1], e.what());
      return accel_cli::exit_code_for(e);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "accel %s: out of host memory; free memory or lower the budgets and run again\n", argv[1]);
      return accel_cli::exit_internal;
    } catch (const std::exception& e) {  // std::filesystem_error, nlohmann::json::exception, ...: a bug
      std::fprintf(stderr, "accel %s: internal error: %s (please report it)\n", argv[1], e.what());
      return accel_cli::exit_internal;
    } catch (...) {
      std::fprintf(stderr, "accel %s: internal error: an exception of unknown type (please report it)\n", argv[1]);
      return accel_cli::exit_internal;
    }
  }
  std::fprintf(stderr, "accel: unknown command '%s'\n\n", argv[1]);
  print_help(stderr);
  return accel_cli::exit_usage;
}
