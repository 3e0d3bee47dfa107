// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel launch`: start N processes with the rank environment, supervise them, stop them together.
// The command line is read here (parse_launch_args); the library plans and runs the job.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <accel/comm/store.hpp>
#include <accel/launch/launch_plan.hpp>
#include <accel/launch/run.hpp>
#include <accel/runtime/error.hpp>

#include "args.hpp"

namespace accel_cli {

/// `accel launch`'s options (its --help is launch_help below). Ranges as accelerate's: up to 65536
/// processes and machines, ports 0-65535.
inline constexpr OptionSpec launch_options[] = {
    {.name = "num-processes", .kind = OptionKind::integer, .metavar = "N", .min = 1, .max = 65536},
    {.name = "gpu-ids", .kind = OptionKind::text, .metavar = "IDS"},
    {.name = "cpu"},
    {.name = "gpus-per-process", .kind = OptionKind::integer, .metavar = "K", .min = 1, .max = 65536},
    {.name = "num-machines", .kind = OptionKind::integer, .metavar = "M", .min = 1, .max = 65536},
    {.name = "machine-rank", .kind = OptionKind::integer, .metavar = "R", .min = 0, .max = 65535},
    {.name = "main-process-ip", .kind = OptionKind::text, .metavar = "H"},
    {.name = "main-process-port", .kind = OptionKind::integer, .metavar = "P", .min = 0, .max = 65535},
    {.name = "tee"},
    {.name = "log-dir", .kind = OptionKind::text, .metavar = "D"},
    {.name = "timeout", .kind = OptionKind::seconds, .metavar = "S"},
    {.name = "grace", .kind = OptionKind::seconds_or_zero, .metavar = "S"},
    {.name = "multi-gpu", .refused = "accel launch needs no --multi_gpu; --num_processes N starts N processes"},
};

/// @brief `accel launch`'s command line: what to launch, or a request for help.
struct LaunchCommandLine {
  accel::launch::LaunchOptions options;  ///< the job (its command is empty only with help)
  bool help = false;                     ///< `--help` or `-h` was given
};

/// @brief Parses the arguments after `launch` (args[0] is the subcommand name and is skipped).
///
/// Options take `--name value` or `--name=value`, with underscores or hyphens (`--num_processes`,
/// `--num-processes`); a later option replaces an earlier one. The program starts after `--`, or at
/// the first argument not starting with `-`; everything after it goes to the program unchanged.
/// @throws accel::usage_error naming the option and the value for unknown options, missing values,
///         bad numbers, contradictory options, or a missing program (unless `--help`)
inline LaunchCommandLine parse_launch_args(std::span<const std::string_view> args) {
  const ParsedArgs a =
      parse_args(args, {.options = launch_options, .operands = Operands::program, .style = Style::launcher});
  LaunchCommandLine out;
  out.help = a.help();
  accel::launch::LaunchOptions& o = out.options;
  o.num_processes = a.integer("num-processes");
  if (auto ids = a.value("gpu-ids")) {
    if (*ids == "all") o.gpu_ids.reset();
    else o.gpu_ids = std::move(*ids);
  }
  o.cpu = a.has("cpu");
  o.gpus_per_process = a.integer("gpus-per-process");
  if (auto n = a.integer("num-machines")) o.num_machines = *n;
  o.machine_rank = a.integer("machine-rank");
  for (const auto& ip : a.values("main-process-ip"))
    if (ip.empty() || ip.find_first_of(" \t") != std::string::npos)
      throw accel::usage_error(a.spelling("main-process-ip") + " '" + ip + "' is not a host name or address");
  o.main_process_ip = a.value("main-process-ip");
  o.main_process_port = a.integer("main-process-port");
  o.tee = a.has("tee");
  for (const auto& dir : a.values("log-dir"))
    if (dir.empty()) throw accel::usage_error(a.spelling("log-dir") + " needs a directory name, got ''");
  o.log_dir = a.value("log-dir");
  if (auto t = a.value("timeout")) o.timeout_s = std::move(*t);
  if (auto g = a.seconds("grace")) o.grace_s = *g;
  o.command = a.positional();
  if (o.cpu && o.gpu_ids)
    throw accel::usage_error("--cpu and --gpu_ids " + *o.gpu_ids + " contradict each other; pass one of them");
  if (o.command.empty() && !out.help)
    throw accel::usage_error("no program to launch; usage: accel launch [options] [--] program [args...]");
  return out;
}

/// @brief parse_launch_args over `argv`-style words.
inline LaunchCommandLine parse_launch_args(std::span<char* const> args) {
  const std::vector<std::string_view> words(args.begin(), args.end());
  return parse_launch_args(std::span<const std::string_view>(words));
}

inline constexpr const char* launch_help = R"(usage: accel launch [options] [--] program [args...]

Starts one process per GPU (per K GPUs with --gpus_per_process K, or --num_processes of them)
running `program args...`, gives each its rank environment, and supervises them: when one fails,
the others are stopped and accel launch exits with the failed process's exit code.

options (each also spelled with hyphens, e.g. --num-processes; values as `--opt V` or `--opt=V`):
  --num_processes N       processes in the whole job, all machines together (with --num_machines M
                          it is required, must be a multiple of M, and each machine runs N/M).
                          Default on one machine: one per visible GPU, 1 when there is none.
  --gpu_ids 2,5           GPUs to use, as nvidia-smi numbers them (or GPU-/MIG- UUIDs); becomes the
                          children's CUDA_VISIBLE_DEVICES, so they see cuda:0 and cuda:1. "all" = every GPU.
  --cpu                   run on the CPU: sets ACCEL_USE_CPU=1 and skips every GPU check.
  --gpus_per_process K    GPUs each process owns (default 1, or an exported ACCEL_GPUS_PER_PROCESS):
                          local process r gets the visible GPUs r*K to r*K+K-1, its first one as its
                          device. Sets ACCEL_GPUS_PER_PROCESS=K for every process; the default
                          process count becomes visible GPUs / K. Not with --cpu (unless K is 1).
  --num_machines M        machines in the job (default 1). With M > 1 every machine runs
                          accel launch with the same options except --machine_rank, and needs:
  --machine_rank R        this machine's index, 0 to M-1 (machine 0 hosts rank 0).
  --main_process_ip H     machine 0's address (MASTER_ADDR; default 127.0.0.1 on one machine).
  --main_process_port P   port on machine 0 (MASTER_PORT). On one machine the default (or 0) picks a
                          free port, so concurrent jobs never collide.
  --tee                   prefix every output line with [rank N] (lines are never cut or mixed).
  --log_dir D             also write each process's output to D/rank_N.stdout.log and D/rank_N.stderr.log.
  --timeout S             seconds a collective may wait before failing (ACCEL_TIMEOUT_S, default 300).
  --grace S               seconds between SIGTERM and SIGKILL when stopping processes (default 10).
  -h, --help              show this help.

each process gets:
  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (machine index), GROUP_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT, ACCEL_LAUNCHED=1, ACCEL_JOB_TOKEN (128 random bits as hex; with several
  machines the ACCEL_JOB_TOKEN you export on every machine), ACCEL_TIMEOUT_S, ACCEL_STORE (host:port
  of the store the launcher hosts on one machine; with several machines rank 0 hosts it at
  MASTER_ADDR:MASTER_PORT and ACCEL_STORE is unset), CUDA_VISIBLE_DEVICES (with --gpu_ids),
  ACCEL_USE_CPU=1 (with --cpu), ACCEL_GPUS_PER_PROCESS=K (with --gpus_per_process). Other
  launchers' rank variables (SLURM_PROCID, OMPI_COMM_WORLD_*, PMI_*, MV2_*) are removed so they
  cannot contradict these.

checks before anything starts:
  CUDA_VISIBLE_DEVICES set but empty, or listing a GPU twice  -> error (exit 3) with the fix
  more processes per machine than visible GPUs                 -> error (exit 3; exit 2 with --gpu_ids)
    (with --gpus_per_process K: fewer visible GPUs than processes x K; the message names K)
  --gpus_per_process not a positive integer, or above 1 with --cpu -> error (exit 2)
  ACCEL_GPUS_PER_PROCESS exported but not a positive integer   -> error (exit 3)
  fewer processes (x K) than visible GPUs                      -> warning naming the unused GPUs
  no GPU visible (no driver) and no --cpu                      -> warning; processes run on the CPU

supervision:
  - A process that exits non-zero or is killed by a signal fails the job: the others get SIGTERM,
    then SIGKILL after --grace seconds. accel launch prints which rank failed and how.
  - The first process to fail is blamed, even when one that failed because of it ends first: the
    store (one machine) tells which left the job first, and processes that already left it get up
    to 2 s (at most --grace) to end on their own before SIGTERM. The others are named as consequences.
  - SIGINT, SIGTERM, SIGHUP, SIGQUIT sent to accel launch are forwarded to every process (each runs
    in its own process group, so its own children get it too); a second one kills them at once.
  - No process outlives accel launch, even when accel launch itself is killed with SIGKILL.
  - Standard input reaches local rank 0 when it is a file or a pipe; otherwise /dev/null.

exit status:
  0                 every process exited with 0
  the child's code  the first process that failed exited with that code
  128 + signal      the first process that failed was killed by that signal (e.g. 139 = SIGSEGV),
                    or accel launch itself received that signal (130 = SIGINT, 143 = SIGTERM)
  2 / 3 / 8         bad command line / environment that cannot work / a process could not be started

examples:
  accel launch --num_processes 2 ./infer --prompts prompts.txt
  accel launch --gpu_ids 2,5 --tee -- ./infer
  accel launch --gpus_per_process 2 ./infer   # 8 GPUs: 4 processes of 2 GPUs each
  accel launch --cpu --num_processes 4 --log_dir logs ./infer
  # two machines, 8 processes in all (4 each):
  accel launch --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 --num_processes 8 ./infer
)";

/// @brief `accel launch`; returns the launcher's exit status.
inline int run_launch(std::span<char*> args) {
  const LaunchCommandLine line = parse_launch_args(args);
  if (line.help) {
    std::fputs(launch_help, stdout);
    return 0;
  }
  // On one machine the launcher hosts the job's store on loopback, so it outlives any rank (a dead
  // rank 0 is then reported to the others instead of taking the store with it). With several
  // machines ACCEL_STORE stays unset and rank 0 hosts it at MASTER_ADDR:MASTER_PORT.
  // The store also tells which ranks left it, in order: the supervisor blames the first of them
  // that failed, not a rank that failed because of it and happened to end first.
  struct Departures {
    std::mutex mutex;
    std::vector<accel::RankDeparture> seen;
  } departures;
  std::unique_ptr<accel::StoreServer> store;  // after `departures`: stopped before they go
  accel::launch::LaunchHooks hooks;
  hooks.host_store = [&store, &departures](const accel::launch::LaunchPlan& plan) -> std::optional<std::string> {
    if (plan.num_machines > 1) return std::nullopt;
    accel::StoreServerOptions o;
    o.world_size = plan.world_size;
    o.join_timeout = accel::join_timeout_from(accel::process_env());  // the children read the same variable
    o.log = [](const std::string& m) { std::fprintf(stderr, "accel launch: store: %s\n", m.c_str()); };
    o.on_rank_gone = [&departures](const accel::RankDeparture& d) {
      const std::lock_guard lock(departures.mutex);
      departures.seen.push_back(d);
    };
    store = std::make_unique<accel::StoreServer>("127.0.0.1", std::uint16_t{0}, plan.job_token, std::move(o));
    return store->address();
  };
  hooks.store_departures = [&departures] {
    const std::lock_guard lock(departures.mutex);
    return departures.seen;
  };
  return accel::launch::run(line.options, hooks);
}

}  // namespace accel_cli
