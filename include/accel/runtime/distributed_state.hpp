// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file distributed_state.hpp
/// @brief DistributedState: who this process is in the job, and which device (or group of GPUs) is its own.
///
/// @code
///   #include <accel/state.hpp>
///   accel::DistributedState state;  // reads accel launch / torchrun / MPI / SLURM variables
///   std::cout << state << "\n";     // process=1/2 local=1/2 device=cuda:1 (physical GPU 5)
///   for (const auto& prompt : state.split_between_processes(prompts)) run(prompt, state.device());
/// @endcode
#pragma once

#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/devices.hpp>
#include <accel/runtime/env.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/split.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

class Communicator;  // comm/communicator.hpp; attached lazily by the collectives
class StoreClient;   // comm/store.hpp; the job's store, joined when the state is created

namespace detail {
/// @brief How a DistributedState joins its job's store when it is created. <accel/comm/store.hpp>
/// (which the collectives include) installs connect_job_store here, since the runtime layer cannot
/// call the comm layer; in a program without collectives it stays null and nothing is joined.
using JobJoiner = std::shared_ptr<StoreClient> (*)(const LaunchEnv&);
inline JobJoiner& job_joiner() noexcept {
  static JobJoiner joiner = nullptr;
  return joiner;
}
}  // namespace detail

/// @brief Options for constructing a DistributedState.
struct StateOptions {
  bool cpu = false;                ///< use the CPU even when GPUs are visible
  /// allow more local processes than GPUs (processes share GPUs round-robin); one GPU per process
  /// only: groups of several GPUs (gpus_per_process > 1) are never shared
  bool allow_gpu_sharing = false;
  /// GPUs each process owns (its group): local process r gets the visible GPUs [r*K, (r+1)*K).
  /// 0: the environment's ACCEL_GPUS_PER_PROCESS (set by `accel launch --gpus_per_process K`), else 1.
  /// Ignored on the CPU.
  int gpus_per_process = 0;
  bool make_current = true;        ///< call cudaSetDevice on the chosen GPU
  /// Join the job's store now (in a program that includes the collectives, with more than one
  /// process), so that a rank that exits, dies or never starts is reported to the others' collectives
  /// within seconds. The states of one process share one connection; the process says goodbye
  /// when the last of them is destroyed. false: join at the first collective, as a state from
  /// injected sources does.
  bool join_job = true;
};

namespace detail {
/// @brief `CUDA_VISIBLE_DEVICES='2,5'` (as the driver reads it) or `CUDA_VISIBLE_DEVICES unset`, for messages.
inline std::string describe_visible(const VisibleDevices& visible) {
  if (!visible.set) return "CUDA_VISIBLE_DEVICES unset";
  std::string ids;
  for (const auto& id : visible.ids) ids += (ids.empty() ? "" : ",") + id;
  return "CUDA_VISIBLE_DEVICES='" + ids + "'";
}
}  // namespace detail

/// @brief The device decision: which logical GPU (or the CPU) a process uses (pure function).
///
/// Rule: no GPU (or `cpu`) → cpu; visible GPUs >= local processes → cuda:<local rank>; exactly one
/// visible GPU → cuda:0 (per-task binding by SLURM or by CUDA_VISIBLE_DEVICES per process); fewer
/// GPUs than local processes → config_error, unless `allow_gpu_sharing` (then local rank mod count).
/// @throws config_error naming the counts and CUDA_VISIBLE_DEVICES, and how to fix it
inline Device choose_device(const LaunchEnv& env, int visible_gpus, const VisibleDevices& visible, const StateOptions& options) {
  if (options.cpu || env.use_cpu || visible_gpus <= 0) return Device::cpu();
  if (visible_gpus >= env.local_world_size) return Device::cuda(env.local_rank);
  if (visible_gpus == 1) return Device::cuda(0);
  if (options.allow_gpu_sharing) return Device::cuda(env.local_rank % visible_gpus);
  detail::throw_error<config_error>(env.local_world_size, " processes run on this machine but only ", visible_gpus,
                                    " GPUs are visible (", detail::describe_visible(visible), "); start at most ", visible_gpus,
                                    " processes per machine (--num_processes ", visible_gpus, "), make more GPUs visible, or "
                                    "opt in to sharing with StateOptions::allow_gpu_sharing");
}

/// @brief How many GPUs each process owns: `options.gpus_per_process` when positive (the
///        environment is then not read), else ACCEL_GPUS_PER_PROCESS, else 1 (pure function).
///        The variable is checked even when the process ends up on the CPU, which ignores it.
/// @throws config_error naming ACCEL_GPUS_PER_PROCESS and its value when it is not a positive integer
/// @throws usage_error when `options.gpus_per_process` is negative
inline int resolve_gpus_per_process(const EnvSource& env, const StateOptions& options) {
  ACCEL_EXPECTS(options.gpus_per_process >= 0, "StateOptions::gpus_per_process is ", options.gpus_per_process,
                "; give a positive number of GPUs per process, or 0 to read ACCEL_GPUS_PER_PROCESS");
  return options.gpus_per_process > 0 ? options.gpus_per_process : gpus_per_process_from(env);
}

/// @brief The device decision for a group of `k` GPUs per process: the process's devices in
/// order, the first being its execution device (pure function).
///
/// Rule: no GPU (or `cpu`) → {cpu}, whatever `k`; k = 1 → {choose_device(...)}, sharing included;
/// visible GPUs >= local processes × k → the group [local rank × k, (local rank + 1) × k); exactly k
/// visible GPUs → [0, k) (per-task binding: SLURM's --gpus-per-task, or CUDA_VISIBLE_DEVICES set per
/// process); fewer → config_error. Groups of several GPUs are never shared, whatever
/// `allow_gpu_sharing` says.
/// @param k GPUs per process (resolve_gpus_per_process), at least 1
/// @throws config_error naming the processes, `k`, the visible GPUs and CUDA_VISIBLE_DEVICES, and how to fix it
inline std::vector<Device> choose_devices(const LaunchEnv& env, int visible_gpus, const VisibleDevices& visible,
                                          const StateOptions& options, int k) {
  ACCEL_EXPECTS(k >= 1, "choose_devices needs at least one GPU per process, got k = ", k);
  if (options.cpu || env.use_cpu || visible_gpus <= 0) return {Device::cpu()};
  if (k == 1) return {choose_device(env, visible_gpus, visible, options)};
  const long long needed = static_cast<long long>(env.local_world_size) * k;
  if (visible_gpus >= needed || visible_gpus == k) {
    const int first = visible_gpus >= needed ? env.local_rank * k : 0;
    std::vector<Device> group;
    for (int i = 0; i < k; ++i) group.push_back(Device::cuda(first + i));
    return group;
  }
  std::vector<std::string> fixes;
  if (const int fits = visible_gpus / k; fits >= 1)
    fixes.push_back(detail::concat("start at most ", text::plural(fits, "process"), " per machine (--num_processes ", fits, ")"));
  if (const int smaller = visible_gpus / env.local_world_size; smaller >= 1)
    fixes.push_back(detail::concat("ask for ", text::plural(smaller, "GPU"), " per process (--gpus_per_process ", smaller,
                                   " or ACCEL_GPUS_PER_PROCESS=", smaller, ")"));
  fixes.push_back(detail::concat("make ", needed, " GPUs visible (or exactly ", k, " to each process)"));
  std::string fix;
  for (std::size_t i = 0; i < fixes.size(); ++i)
    fix += (i == 0 ? "" : i + 1 == fixes.size() ? ", or " : ", ") + fixes[i];
  detail::throw_error<config_error>(
      text::plural(env.local_world_size, "process"), " run on this machine with ", k, " GPUs each (", needed,
      " GPUs) but only ", text::plural(visible_gpus, "GPU"), visible_gpus == 1 ? " is" : " are", " visible (",
      detail::describe_visible(visible), "); ", fix,
      options.allow_gpu_sharing
          ? detail::concat("; StateOptions::allow_gpu_sharing shares single GPUs only: groups of ", k, " GPUs are not shared")
          : std::string{});
}

/// @brief What this process is in the job: ranks, sizes, machine, and its own device (made current).
class DistributedState {
 public:
  /// @brief Reads the real environment and devices, and joins the job (see StateOptions::join_job).
  /// @throws config_error when the launcher variables are malformed or the GPUs cannot be shared out
  /// @throws comm_error / timeout_error when the job's store cannot be reached within the join
  ///         timeout (ACCEL_JOIN_TIMEOUT_S) or refuses this process
  /// @note with join_job, every rank of the job must create its state within the join timeout of the first
  explicit DistributedState(StateOptions options = {})
      : DistributedState(process_env(), default_device_query(), options, process_launcher_query()) {
    if (options.join_job && env_.world_size > 1 && detail::job_joiner()) store_ = detail::job_joiner()(env_);
  }

  /// @brief From injected sources (tests, or a planned child environment).
  /// @param query questions read_launch_env may ask the system (default: none)
  DistributedState(const EnvSource& env, const DeviceQuery& devices, StateOptions options = {}, const LauncherQuery& query = {})
      : env_(read_launch_env(env, query)), visible_(parse_visible_devices(env("CUDA_VISIBLE_DEVICES"))) {
    const bool want_cpu = options.cpu || env_.use_cpu;
    const DeviceList list = want_cpu ? DeviceList{{}, "CPU requested", ""} : devices.list(false);
    gpu_count_ = static_cast<int>(list.gpus.size());
    device_status_ = list.status;
    devices_ = choose_devices(env_, gpu_count_, visible_, options, resolve_gpus_per_process(env, options));
    if (devices_.front().is_cuda()) {
      gpu_name_ = list.gpus[static_cast<std::size_t>(devices_.front().index())].name;
      for (const Device& d : devices_) physical_.push_back(visible_.physical(d.index()));
      if (options.make_current && devices.make_current) devices.make_current(devices_.front().index());
    }
  }

  /// @name Ranks and sizes (accelerate's names)
  ///@{
  [[nodiscard]] int process_index() const noexcept { return env_.rank; }
  [[nodiscard]] int local_process_index() const noexcept { return env_.local_rank; }
  [[nodiscard]] int num_processes() const noexcept { return env_.world_size; }
  [[nodiscard]] int local_num_processes() const noexcept { return env_.local_world_size; }
  [[nodiscard]] int machine_index() const noexcept { return env_.group_rank; }
  [[nodiscard]] int num_machines() const noexcept { return env_.num_machines; }
  [[nodiscard]] bool is_main_process() const noexcept { return env_.rank == 0; }
  [[nodiscard]] bool is_local_main_process() const noexcept { return env_.local_rank == 0; }
  [[nodiscard]] bool is_last_process() const noexcept { return env_.rank == env_.world_size - 1; }
  [[nodiscard]] bool use_distributed() const noexcept { return env_.world_size > 1; }
  ///@}

  /// @brief This process's device: `cuda:<logical index>` (already current) or `cpu`; with a
  /// group of GPUs (StateOptions::gpus_per_process), the group's first, its execution device.
  [[nodiscard]] Device device() const noexcept { return devices_.front(); }
  /// @brief Every device this process owns, in order: its group of GPUs (`cuda:2, cuda:3` for
  /// local process 1 with two GPUs each), or `{device()}` with one GPU per process or on the CPU.
  [[nodiscard]] const std::vector<Device>& devices() const noexcept { return devices_; }
  /// @brief The physical GPU behind device(): its index or UUID from CUDA_VISIBLE_DEVICES; "" on CPU.
  [[nodiscard]] const std::string& physical_gpu() const noexcept {
    static const std::string none;
    return physical_.empty() ? none : physical_.front();
  }
  /// @brief The physical GPUs behind devices(), in the same order; empty on CPU.
  [[nodiscard]] const std::vector<std::string>& physical_gpus() const noexcept { return physical_; }
  /// @brief The name of device()'s GPU ("NVIDIA H200"), "" on CPU.
  [[nodiscard]] const std::string& gpu_name() const noexcept { return gpu_name_; }
  /// @brief Number of GPUs visible to this process.
  [[nodiscard]] int visible_gpu_count() const noexcept { return gpu_count_; }
  /// @brief Why no GPU is visible ("insufficient driver", …), "" when some are.
  [[nodiscard]] const std::string& device_status() const noexcept { return device_status_; }
  /// @brief The launcher facts (rendezvous address, job id and token, timeout, diagnostics).
  [[nodiscard]] const LaunchEnv& launch_env() const noexcept { return env_; }
  /// @brief CUDA_VISIBLE_DEVICES as parsed, with diagnostics.
  [[nodiscard]] const VisibleDevices& visible_devices() const noexcept { return visible_; }

  /// @brief This process's share of `range` (see accel::split_between_processes).
  template <class R>
  auto split_between_processes(R&& range, SplitOptions options = {}) const {
    return accel::split_between_processes(std::forward<R>(range), static_cast<std::size_t>(env_.rank),
                                          static_cast<std::size_t>(env_.world_size), options);
  }

  /// @brief The job's store this process joined (null when it has not joined yet); the collectives'
  /// communicator runs on it.
  [[nodiscard]] const std::shared_ptr<StoreClient>& job_store() const noexcept { return store_; }
  /// @brief Installs the store connection the communicator will run on.
  void attach_job_store(std::shared_ptr<StoreClient> store) noexcept { store_ = std::move(store); }

  /// @brief The communicator the collectives use; null until the first collective creates one.
  [[nodiscard]] Communicator* communicator() const noexcept { return comm_.get(); }
  /// @brief Installs the communicator the collectives will use from now on.
  void attach_communicator(std::shared_ptr<Communicator> comm) noexcept { comm_ = std::move(comm); }

  /// @brief One line: `process=1/2 local=1/2 device=cuda:1 (physical GPU 5)`; with a group of
  /// GPUs, `process=1/2 local=1/2 device=cuda:2 group=cuda:2,cuda:3 (physical GPUs 6,7)`.
  [[nodiscard]] std::string to_string() const {
    std::ostringstream out;
    out << *this;
    return out.str();
  }
  friend std::ostream& operator<<(std::ostream& out, const DistributedState& s) {
    out << "process=" << s.env_.rank << '/' << s.env_.world_size << " local=" << s.env_.local_rank << '/'
        << s.env_.local_world_size << " device=" << s.device();
    if (s.devices_.size() > 1) {
      out << " group=";
      for (std::size_t i = 0; i < s.devices_.size(); ++i) out << (i == 0 ? "" : ",") << s.devices_[i];
      out << " (physical GPUs ";
      for (std::size_t i = 0; i < s.physical_.size(); ++i) out << (i == 0 ? "" : ",") << s.physical_[i];
      out << ')';
    } else if (s.device().is_cuda()) {
      out << " (physical GPU " << s.physical_.front() << ')';
    }
    return out;
  }

 private:
  LaunchEnv env_;
  VisibleDevices visible_;
  std::vector<Device> devices_;  // never empty: {cpu} or the GPUs of this process, execution device first
  int gpu_count_ = 0;
  std::string device_status_;
  std::string gpu_name_;
  std::vector<std::string> physical_;  // behind devices_, one each; empty on CPU
  std::shared_ptr<StoreClient> store_;  // before comm_: the communicator's destructor still uses it
  std::shared_ptr<Communicator> comm_;
};

ACCEL_NAMESPACE_END
