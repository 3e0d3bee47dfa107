// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file launch_plan.hpp
/// @brief accel launch's decisions: the options of a job, and the per-rank plan (environment +
/// checklist) made from them.
///
/// The decisions are pure functions over values (`plan_launch`); the effects (`run`, in run.hpp)
/// live in detail/supervisor.hpp and are exercised by the multi-process tests. The `accel launch`
/// command line is read by the accel tool (tools/commands/launch.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <accel/comm/store_core.hpp>
#include <accel/runtime/config.hpp>
#include <accel/runtime/devices.hpp>
#include <accel/runtime/env.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN
namespace launch {

/// @brief What `accel launch` was asked to do (the options of its command line); every member has
///        a default, so `{.num_processes = 2, .cpu = true}` names only what differs.
struct LaunchOptions {
  /// Processes in the whole job (all machines together; required with several machines);
  /// unset on one machine = one per visible GPU (1 with none).
  std::optional<int> num_processes{};
  std::optional<std::string> gpu_ids{};          ///< `--gpu_ids 2,5`: CUDA_VISIBLE_DEVICES for the children ("all" = unset)
  bool cpu = false;                              ///< `--cpu`: run on the CPU (ACCEL_USE_CPU=1), skip every GPU check
  /// `--gpus_per_process K`: GPUs each process owns (ACCEL_GPUS_PER_PROCESS=K for the children), so
  /// the default process count is visible GPUs / K; unset = the launcher's ACCEL_GPUS_PER_PROCESS, else 1.
  std::optional<int> gpus_per_process{};
  int num_machines = 1;
  std::optional<int> machine_rank{};             ///< this machine's index, required with several machines
  std::optional<std::string> main_process_ip{};  ///< MASTER_ADDR; required with several machines
  std::optional<int> main_process_port{};        ///< MASTER_PORT; unset or 0 = a free port (one machine only)
  bool tee = false;                              ///< prefix each output line with `[rank N]`
  std::optional<std::string> log_dir{};          ///< also write `<dir>/rank_N.{stdout,stderr}.log`
  std::string timeout_s = "300";                 ///< ACCEL_TIMEOUT_S for the children (collective timeout)
  double grace_s = 10;                           ///< SIGTERM → SIGKILL grace period when stopping children
  std::vector<std::string> command{};            ///< program and its arguments
};

/// @brief What the launcher's own process knows when planning (the seams a test fakes).
struct LaunchInputs {
  std::optional<std::string> cuda_visible_devices;  ///< the launcher's CUDA_VISIBLE_DEVICES (nullopt: unset)
  int gpu_count = 0;                                ///< GPUs the launcher sees (accel::visible_gpu_count())
  std::string gpu_status;                           ///< why there are none ("insufficient driver", ...)
  int free_port = 0;                                ///< a free port, used when --main_process_port is absent or 0
  std::string fresh_job_token;                      ///< 32 random hex digits for a one-machine job
  std::optional<std::string> env_job_token;         ///< ACCEL_JOB_TOKEN in the launcher's environment
  std::optional<std::string> env_gpus_per_process;  ///< the launcher's ACCEL_GPUS_PER_PROCESS (the children inherit it)
};

/// @brief One process this machine starts.
struct RankPlan {
  int rank = 0;
  int local_rank = 0;
  std::map<std::string, std::string> env;  ///< variables set for it (on top of the launcher's environment)
};

/// @brief Everything the launcher decided before starting anything.
struct LaunchPlan {
  int world_size = 1;
  int local_world_size = 1;
  int num_machines = 1;
  int machine_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::string job_token;
  std::vector<RankPlan> ranks;     ///< this machine's processes, by local rank
  std::vector<std::string> unset;  ///< variables removed from the children's environment
  std::vector<std::string> warnings;
};

/// @brief Variables of other launchers that would contradict ours in a child (a launcher started
/// under srun or mpirun): removed from the children's environment.
inline const std::vector<std::string>& foreign_rank_variables() {
  static const std::vector<std::string> v = {
      "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE",
      "MV2_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
      "TORCHELASTIC_USE_AGENT_STORE", "ACCEL_STORE"};
  return v;
}

namespace detail {

/// @brief GPUs per process: --gpus_per_process, else the launcher's ACCEL_GPUS_PER_PROCESS
/// (which the children inherit), else 1.
/// @throws usage_error when --gpus_per_process is below 1, or above 1 with --cpu
/// @throws config_error naming ACCEL_GPUS_PER_PROCESS and its value when it is not a positive integer
inline int gpus_per_process(const LaunchOptions& o, const LaunchInputs& in) {
  using accel::detail::throw_error;
  if (o.gpus_per_process && *o.gpus_per_process < 1)
    throw_error<usage_error>("--gpus_per_process ", *o.gpus_per_process,
                             " is not a positive integer; give the number of GPUs each process owns");
  if (o.cpu && o.gpus_per_process.value_or(1) > 1)
    throw_error<usage_error>("--cpu and --gpus_per_process ", *o.gpus_per_process,
                             " contradict each other: a process on the CPU owns no GPU; pass one of them");
  if (o.gpus_per_process) return *o.gpus_per_process;
  const auto inherited = in.env_gpus_per_process;
  return gpus_per_process_from([&inherited](const std::string& name) {
    return name == "ACCEL_GPUS_PER_PROCESS" ? inherited : std::nullopt;
  });
}

/// @brief `a, b, or c` (`a or b`, `a`).
inline std::string either(const std::vector<std::string>& choices) {
  std::string out;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const char* before = i == 0 ? "" : i + 1 < choices.size() ? ", " : i == 1 ? " or " : ", or ";
    out += before + choices[i];
  }
  return out;
}

/// @brief The GPU checklist: how many processes this machine runs with `k` GPUs each, and what
/// the children see.
inline int check_gpus(const LaunchOptions& o, const LaunchInputs& in, LaunchPlan& plan, int requested_local,
                      std::optional<std::string>& child_visible, int k) {
  using accel::detail::concat;
  using accel::detail::throw_error;
  const bool explicit_n = o.num_processes.has_value();
  std::vector<std::string> physical;  // what each logical GPU of the children is, in order
  std::string where;                  // how we describe the device list in messages
  bool checkable = true;              // do we know how many GPUs the children will see?
  if (o.gpu_ids) {
    const VisibleDevices v = parse_visible_devices(*o.gpu_ids);
    if (v.ids.empty() && !v.duplicated)
      throw_error<usage_error>("--gpu_ids '", *o.gpu_ids, "' names no GPU; list GPU indices or UUIDs like --gpu_ids 0,1, or pass --cpu");
    if (v.duplicated)
      throw_error<usage_error>("--gpu_ids ", *o.gpu_ids, " lists a GPU twice (the driver would then expose none); list each GPU once");
    if (v.truncated)
      throw_error<usage_error>("--gpu_ids ", *o.gpu_ids, ": ", v.diagnostics.back());
    physical = v.ids;
    child_visible = text::join(v.ids, ",");
    where = concat("--gpu_ids ", *child_visible);
    if (in.cuda_visible_devices && *in.cuda_visible_devices != *child_visible)
      plan.warnings.push_back(concat("--gpu_ids ", *child_visible, " replaces CUDA_VISIBLE_DEVICES='", *in.cuda_visible_devices,
                                     "' for the children; --gpu_ids names GPUs as nvidia-smi numbers them"));
    if (in.gpu_count == 0) {
      plan.warnings.push_back(concat("cannot check --gpu_ids ", *child_visible, ": the launcher sees no GPU (",
                                     in.gpu_status.empty() ? "no CUDA device" : in.gpu_status, ")"));
    } else if (!in.cuda_visible_devices && !v.uses_uuids) {
      for (const auto& id : v.ids)
        if (const auto n = text::parse_integer<int>(id); !n || *n >= in.gpu_count)
          throw_error<config_error>("--gpu_ids ", *child_visible, " names GPU ", id, ", but this machine has ",
                                    text::plural(in.gpu_count, "GPU"), " (0-", in.gpu_count - 1, "); pick GPUs that exist");
    }
  } else {
    const VisibleDevices v = parse_visible_devices(in.cuda_visible_devices);
    if (v.set) where = concat("CUDA_VISIBLE_DEVICES='", *in.cuda_visible_devices, "'");
    if (v.set && v.ids.empty() && !v.duplicated)
      throw_error<config_error>("CUDA_VISIBLE_DEVICES is set to '", *in.cuda_visible_devices,
                                "', so no GPU is visible; unset it to use every GPU, choose GPUs with --gpu_ids 0,1, "
                                "or pass --cpu to run on the CPU");
    if (v.duplicated)
      throw_error<config_error>(v.diagnostics.back(), "; or choose GPUs with --gpu_ids");
    for (const auto& d : v.diagnostics) plan.warnings.push_back(concat("CUDA_VISIBLE_DEVICES: ", d));
    for (int g = 0; g < in.gpu_count; ++g) physical.push_back(v.physical(g));
    if (where.empty()) where = concat(text::plural(in.gpu_count, "GPU"), " on this machine");
    if (in.gpu_count == 0) {
      checkable = false;
      plan.warnings.push_back(concat("no GPU is visible (", in.gpu_status.empty() ? "no CUDA device" : in.gpu_status,
                                     "): every process runs on the CPU; pass --cpu to say so and silence this warning"));
    }
  }
  const int gpus = static_cast<int>(physical.size());
  const int local = requested_local > 0 ? requested_local : std::max(1, gpus / k);
  if (!checkable) return local;
  const std::string per = o.num_machines > 1 ? " per machine" : "";
  const long long needed = static_cast<long long>(local) * k;
  if (k > 1 && needed > gpus) {
    std::vector<std::string> fixes;
    if (gpus / k >= 1) fixes.push_back(concat("pass --num_processes ", gpus / k * o.num_machines));
    if (gpus / local >= 1) fixes.push_back(concat("pass --gpus_per_process ", gpus / local));
    fixes.push_back(o.gpu_ids ? "list more GPUs with --gpu_ids" : "choose more GPUs with --gpu_ids");
    fixes.push_back("run on the CPU with --cpu and no --gpus_per_process");
    const std::string need = concat(text::plural(local, "process"), per, " with ", k, " GPUs each need", local == 1 ? "s " : " ",
                                    needed, " GPUs");
    if (o.gpu_ids)
      throw_error<usage_error>(need, " but ", where, " lists only ", text::plural(gpus, "GPU"), ": each process needs ", k,
                               " GPUs of its own; ", either(fixes));
    throw_error<config_error>(need, " but only ", text::plural(gpus, "GPU"), " visible (", where, "): each process needs ", k,
                              " GPUs of its own; ", either(fixes));
  }
  if (local > gpus) {
    const std::string fix = concat("pass --num_processes ", gpus * o.num_machines, o.gpu_ids ? ", list more GPUs with --gpu_ids" : ", choose more GPUs with --gpu_ids",
                                   ", or run on the CPU with --cpu");
    if (o.gpu_ids)
      throw_error<usage_error>(text::plural(local, "process"), per, " but ", where, " lists only ", text::plural(gpus, "GPU"),
                               ": each process needs its own GPU; ", fix);
    throw_error<config_error>(text::plural(local, "process"), per, " but only ", text::plural(gpus, "GPU"), " visible (", where,
                              "): each process needs its own GPU; ", fix);
  }
  if (needed < gpus && (explicit_n || k > 1)) {
    const int used = static_cast<int>(needed);
    std::string unused;
    for (int g = used; g < gpus; ++g) unused += (unused.empty() ? "" : ",") + physical[static_cast<std::size_t>(g)];
    const int most = gpus / k;  // processes that would fit
    const std::string fix =
        most > local ? concat("pass --num_processes ", most * o.num_machines,
                              gpus % k == 0 ? " to use every GPU" : " to use more of them", ", or choose GPUs with --gpu_ids")
                     : concat(text::plural(gpus, "GPU"), " do not divide into groups of ", k, "; choose a multiple of ", k,
                              " GPUs with --gpu_ids");
    plan.warnings.push_back(concat(text::plural(gpus, "GPU"), " visible (", where, ") but ", text::plural(local, "process"), per,
                                   k > 1 ? concat(" with ", k, " GPUs each") : std::string{}, ": GPU",
                                   gpus - used == 1 ? " " : "s ", unused, " stay", gpus - used == 1 ? "s" : "", " unused; ", fix));
  }
  return local;
}

}  // namespace detail

/// @brief Decides everything before a process starts: sizes, ranks, the rendezvous address and
/// each child's environment, and runs the checklist (pure function).
///
/// `--num_processes` counts the whole job; with several machines it is required, must divide evenly,
/// and each machine runs num_processes / num_machines. On one machine it defaults to one process per
/// visible GPU, or per K with `--gpus_per_process K` (one with none).
/// @throws usage_error for contradictory or incomplete options (multi-machine without an address,
///         a total that does not divide, more processes × K than --gpu_ids lists, --cpu with
///         --gpus_per_process above 1, --gpus_per_process below 1)
/// @throws config_error for an environment that cannot work (CUDA_VISIBLE_DEVICES empty or
///         duplicated, fewer GPUs than processes × K, a multi-machine job without ACCEL_JOB_TOKEN,
///         a malformed ACCEL_GPUS_PER_PROCESS)
inline LaunchPlan plan_launch(const LaunchOptions& o, const LaunchInputs& in) {
  using accel::detail::concat;
  using accel::detail::throw_error;
  LaunchPlan plan;
  plan.num_machines = o.num_machines;
  const bool multi = o.num_machines > 1;
  int requested_local = 0;
  if (o.num_processes) {
    if (*o.num_processes % o.num_machines != 0) {
      const int below = *o.num_processes / o.num_machines * o.num_machines;
      throw_error<usage_error>("--num_processes ", *o.num_processes, " is not divisible by --num_machines ", o.num_machines,
                               ": --num_processes counts the processes of all machines together; use a multiple of ",
                               o.num_machines, " (", below > 0 ? concat(below, " or ") : std::string{},
                               below + o.num_machines, ")");
    }
    requested_local = *o.num_processes / o.num_machines;
  }
  if (multi) {
    // Machines with different GPU counts would each compute another WORLD_SIZE from a default.
    if (!o.num_processes)
      throw_error<usage_error>("--num_machines ", o.num_machines,
                               " needs --num_processes (the total over all machines) so every machine agrees on WORLD_SIZE");
    if (!o.machine_rank)
      throw_error<usage_error>("--num_machines ", o.num_machines, " needs --machine_rank (0 to ", o.num_machines - 1,
                               ") on every machine");
    if (*o.machine_rank >= o.num_machines)
      throw_error<usage_error>("--machine_rank ", *o.machine_rank, " is not below --num_machines ", o.num_machines,
                               "; machines are numbered 0 to ", o.num_machines - 1);
    if (!o.main_process_ip)
      throw_error<usage_error>("--num_machines ", o.num_machines,
                               " needs --main_process_ip: the address of machine 0, the same on every machine");
    if (!o.main_process_port || *o.main_process_port == 0)
      throw_error<usage_error>("--num_machines ", o.num_machines,
                               " needs --main_process_port: a port free on machine 0, the same on every machine");
    if (!in.env_job_token || in.env_job_token->empty() ||
        in.env_job_token->find_first_of(" \t\n") != std::string::npos)
      throw_error<config_error>("a job on ", o.num_machines, " machines needs the same ACCEL_JOB_TOKEN on every machine",
                                in.env_job_token ? concat(" (got '", *in.env_job_token, "')") : std::string{},
                                "; run `export ACCEL_JOB_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')` once and "
                                "copy that value to every machine");
    plan.job_token = *in.env_job_token;
  } else {
    if (o.machine_rank && *o.machine_rank != 0)
      throw_error<usage_error>("--machine_rank ", *o.machine_rank, " needs --num_machines above ", *o.machine_rank,
                               " (one machine is machine 0)");
    plan.job_token = in.fresh_job_token;
  }
  plan.machine_rank = o.machine_rank.value_or(0);
  std::optional<std::string> child_visible;
  const int k = detail::gpus_per_process(o, in);
  if (o.cpu) plan.local_world_size = requested_local > 0 ? requested_local : 1;
  else plan.local_world_size = detail::check_gpus(o, in, plan, requested_local, child_visible, k);
  plan.world_size = plan.local_world_size * o.num_machines;
  plan.master_addr = o.main_process_ip.value_or("127.0.0.1");
  plan.master_port = o.main_process_port.value_or(0);
  if (plan.master_port == 0) {
    ACCEL_EXPECTS(in.free_port > 0 && in.free_port <= 65535, "LaunchInputs::free_port must hold a free port, got ", in.free_port);
    plan.master_port = in.free_port;
  }
  plan.unset = foreign_rank_variables();
  for (int l = 0; l < plan.local_world_size; ++l) {
    RankPlan r;
    r.local_rank = l;
    r.rank = plan.machine_rank * plan.local_world_size + l;
    auto& e = r.env;
    e["RANK"] = std::to_string(r.rank);
    e["LOCAL_RANK"] = std::to_string(l);
    e["WORLD_SIZE"] = std::to_string(plan.world_size);
    e["LOCAL_WORLD_SIZE"] = std::to_string(plan.local_world_size);
    e["GROUP_RANK"] = std::to_string(plan.machine_rank);
    e["GROUP_WORLD_SIZE"] = std::to_string(plan.num_machines);
    e["MASTER_ADDR"] = plan.master_addr;
    e["MASTER_PORT"] = std::to_string(plan.master_port);
    e["ACCEL_LAUNCHED"] = "1";
    e["ACCEL_JOB_TOKEN"] = plan.job_token;
    e["ACCEL_TIMEOUT_S"] = o.timeout_s;
    if (o.cpu) e["ACCEL_USE_CPU"] = "1";
    if (child_visible) e["CUDA_VISIBLE_DEVICES"] = *child_visible;
    if (o.gpus_per_process) e["ACCEL_GPUS_PER_PROCESS"] = std::to_string(k);
    plan.ranks.push_back(std::move(r));
  }
  return plan;
}

/// @brief Records the store the launcher hosts: every child gets ACCEL_STORE=`address`.
inline void set_store_address(LaunchPlan& plan, const std::string& address) {
  for (auto& r : plan.ranks) r.env["ACCEL_STORE"] = address;
}

/// @brief The complete environment of one child: `parent` ("NAME=value" entries) minus `plan.unset`,
/// with the rank's variables replacing any inherited value.
inline std::vector<std::string> child_environment(const LaunchPlan& plan, const RankPlan& rank,
                                                  const std::vector<std::string>& parent) {
  std::vector<std::string> out;
  for (const auto& entry : parent) {
    const std::string name = entry.substr(0, entry.find('='));
    bool drop = rank.env.count(name) != 0;
    for (const auto& u : plan.unset) drop = drop || u == name;
    if (!drop) out.push_back(entry);
  }
  for (const auto& [k, v] : rank.env) out.push_back(k + "=" + v);
  return out;
}

/// @brief Effects the caller can plug in. Empty members mean "not used".
struct LaunchHooks {
  /// @brief Starts the store for this job and returns its "host:port" (set as ACCEL_STORE), or
  /// nullopt for none. Called once per machine after planning, before any child starts, with the
  /// launcher's signals already blocked (threads it starts inherit that mask). What it starts must
  /// stay alive until `run` returns: keep the server in an object the callback's owner holds.
  std::function<std::optional<std::string>(const LaunchPlan&)> host_store;
  /// @brief The ranks the store started by `host_store` saw leave so far, in the order it saw
  /// them (StoreServerOptions::on_rank_gone). Called from the supervising thread while the store's
  /// thread may add to it. With it, a rank that failed as a consequence of another's failure but
  /// ended first is not blamed for it.
  std::function<std::vector<RankDeparture>()> store_departures;
  /// @brief Where the launcher's own messages go (default: stderr).
  std::function<void(const std::string&)> message;
};

/// @brief Open files the launcher holds at once for a job on this machine: its own (standard
///        streams, signal and epoll descriptors, the store's listening socket, spares), per local
///        process a pidfd, two pipes with `tee` or `log_dir` and two log files with `log_dir`, a
///        spawn's transient pipes, and, when it hosts the store, two connections per rank of the job.
[[nodiscard]] inline std::uint64_t launcher_open_files(const LaunchPlan& plan, const LaunchOptions& options, bool hosts_store) {
  const std::uint64_t per_rank = 1 + (options.tee || options.log_dir ? 2 : 0) + (options.log_dir ? 2 : 0);
  return 64 + per_rank * plan.ranks.size() + 4 + (hosts_store ? 2 * static_cast<std::uint64_t>(plan.world_size) : 0);
}

/// @brief The soft open-file limit to run a job under (a pure decision): unchanged (nullopt) when
///        `needed` fits under `soft`; else raised toward `hard`, as servers and language runtimes
///        raise theirs (twice what is needed, at most `hard`).
/// @param hard the hard limit (RLIM_INFINITY counts as unbounded)
/// @throws launch_error naming the files needed and both limits when even `hard` is too low
[[nodiscard]] inline std::optional<std::uint64_t> raised_open_file_limit(std::uint64_t needed, std::uint64_t soft,
                                                                         std::uint64_t hard, std::size_t local_processes) {
  if (needed <= soft) return std::nullopt;
  if (needed > hard)
    accel::detail::throw_error<launch_error>("this job needs about ", needed, " open files in the launcher (", local_processes,
                                             " local processes) but its open-file limit is ", soft, " (hard limit ", hard,
                                             "); raise the hard limit (ulimit -Hn as root, LimitNOFILE= for a systemd "
                                             "service, nofile in limits.conf) or start fewer processes per machine");
  return std::min(hard, std::max(needed * 2, soft));
}

}  // namespace launch
ACCEL_NAMESPACE_END
