// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel launch`: start N processes with the rank environment, supervise them, stop them together.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <accel/comm/store.hpp>
#include <accel/launch/run.hpp>

namespace accel_cli {

inline constexpr const char* launch_help = R"(usage: accel launch [options] [--] program [args...]

Starts one process per GPU (or --num_processes of them) running `program args...`, gives each its
rank environment, and supervises them: when one fails, the others are stopped and accel launch exits
with the failed process's exit code.

options (each also spelled with hyphens, e.g. --num-processes; values as `--opt V` or `--opt=V`):
  --num_processes N       processes in the whole job, all machines together (with --num_machines M
                          it is required, must be a multiple of M, and each machine runs N/M).
                          Default on one machine: one per visible GPU, 1 when there is none.
  --gpu_ids 2,5           GPUs to use, as nvidia-smi numbers them (or GPU-/MIG- UUIDs); becomes the
                          children's CUDA_VISIBLE_DEVICES, so they see cuda:0 and cuda:1. "all" = every GPU.
  --cpu                   run on the CPU: sets ACCEL_USE_CPU=1 and skips every GPU check.
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
  ACCEL_USE_CPU=1 (with --cpu). Other launchers' rank variables (SLURM_PROCID, OMPI_COMM_WORLD_*,
  PMI_*, MV2_*) are removed so they cannot contradict these.

checks before anything starts:
  CUDA_VISIBLE_DEVICES set but empty, or listing a GPU twice  -> error (exit 3) with the fix
  more processes per machine than visible GPUs                 -> error (exit 3; exit 2 with --gpu_ids)
  fewer processes than visible GPUs                            -> warning naming the unused GPUs
  no GPU visible (no driver) and no --cpu                      -> warning; processes run on the CPU

supervision:
  - A process that exits non-zero or is killed by a signal fails the job: the others get SIGTERM,
    then SIGKILL after --grace seconds. accel launch prints which rank failed and how.
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
  accel launch --cpu --num_processes 4 --log_dir logs ./infer
  # two machines, 8 processes in all (4 each):
  accel launch --num_machines 2 --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 --num_processes 8 ./infer
)";

/// @brief `accel launch`; returns the launcher's exit status.
inline int run_launch(std::span<char*> args) {
  const accel::launch::LaunchOptions options = accel::launch::parse_launch_args(args);
  if (options.help) {
    std::fputs(launch_help, stdout);
    return 0;
  }
  // On one machine the launcher hosts the job's store on loopback, so it outlives any rank (a dead
  // rank 0 is then reported to the others instead of taking the store with it). With several
  // machines ACCEL_STORE stays unset and rank 0 hosts it at MASTER_ADDR:MASTER_PORT.
  std::unique_ptr<accel::StoreServer> store;
  accel::launch::LaunchHooks hooks;
  hooks.host_store = [&store](const accel::launch::LaunchPlan& plan) -> std::optional<std::string> {
    if (plan.num_machines > 1) return std::nullopt;
    accel::StoreServerOptions o;
    o.world_size = plan.world_size;
    o.log = [](const std::string& m) { std::fprintf(stderr, "accel launch: store: %s\n", m.c_str()); };
    store = std::make_unique<accel::StoreServer>("127.0.0.1", std::uint16_t{0}, plan.job_token, std::move(o));
    return store->address();
  };
  return accel::launch::run(options, hooks);
}

}  // namespace accel_cli
