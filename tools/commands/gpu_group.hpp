// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `--gpus_per_process K --process R` of `accel plan` and `accel load`: a dry run as local process R
// of a job with K GPUs per process (accel launch --gpus_per_process K) would plan and load, on this
// machine's visible GPUs. The group is chosen by the rule DistributedState uses (choose_devices).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <accel/runtime/devices.hpp>
#include <accel/runtime/distributed_state.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/plan/max_memory.hpp>

#include "args.hpp"

namespace accel_cli {

/// @brief `--simulate-gpus '8GiB,8GiB'`: one host-simulated GPU per size.
/// @throws accel::usage_error (naming `command`) for an empty list; config_error for a bad size
inline std::vector<std::uint64_t> parse_simulated_sizes(const std::string& list, const std::string& command) {
  std::vector<std::uint64_t> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const auto comma = list.find(',', start);
    const auto item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(accel::parse_byte_size(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw accel::usage_error(command + ": --simulate-gpus needs sizes like '8GiB,8GiB'");
  return out;
}

/// The two options, for plan's and load's option tables.
inline constexpr OptionSpec gpus_per_process_option = {
    "gpus-per-process", OptionKind::integer, "K",
    "plan as one process of a job with K GPUs per process (accel launch --gpus_per_process K): only its group of GPUs, "
    "which --max-memory's GPU keys then index (0 = its first)", false, 1, 65536};
inline constexpr OptionSpec process_option = {
    "process", OptionKind::integer, "R",
    "with --gpus_per_process: which local process (default 0); it owns the visible GPUs R*K to R*K+K-1", false, 0, 65535};

/// @brief Local process R's group of GPUs on this machine, as `--gpus_per_process K --process R` chose it.
struct GpuGroup {
  int process = 0;                     ///< R
  int gpus_per_process = 1;            ///< K
  int processes = 1;                   ///< local processes the visible GPUs hold (visible / K)
  std::vector<accel::Device> devices;  ///< the group, in order: cuda:R*K to cuda:R*K+K-1
  std::vector<std::string> physical;   ///< the physical GPU behind each (CUDA_VISIBLE_DEVICES)

  /// @brief `cuda:2,cuda:3 (physical GPUs 6,7)`.
  [[nodiscard]] std::string gpus() const {
    std::string list, ids;
    for (const auto& d : devices) list += (list.empty() ? "" : ",") + d.to_string();
    for (const auto& p : physical) ids += (ids.empty() ? "" : ",") + p;
    return list + (physical.size() == 1 ? " (physical GPU " : " (physical GPUs ") + ids + ")";
  }
  /// @brief `local process 1 of 2, 2 GPUs each: cuda:2,cuda:3 (physical GPUs 6,7)`.
  [[nodiscard]] std::string describe() const {
    return accel::detail::concat("local process ", process, " of ", processes, ", ", accel::text::plural(gpus_per_process, "GPU"),
                                 " each: ", gpus());
  }
};

/// @brief The group `--gpus_per_process K [--process R]` asks for over `visible_gpus` GPUs; nullopt
///        without --gpus_per_process.
/// @param command "plan" or "load", for messages
/// @param no_gpu_hint what to do when no GPU is visible (how this command simulates GPUs)
/// @throws accel::usage_error for --process without --gpus_per_process, no visible GPU, fewer
///         visible GPUs than K, or R past the processes the visible GPUs hold, saying what to give instead
inline std::optional<GpuGroup> gpu_group(const ParsedArgs& a, const std::string& command, int visible_gpus,
                                         const accel::VisibleDevices& visible, const std::string& no_gpu_hint) {
  const auto k = a.integer("gpus-per-process");
  if (!k) {
    if (a.has("process"))
      throw accel::usage_error(command + ": " + a.spelling("process") + " " + *a.value("process") +
                               " picks a process of a job with several GPUs per process; give its GPUs per process too "
                               "(--gpus_per_process K), or drop " + a.spelling("process"));
    return std::nullopt;
  }
  GpuGroup g;
  g.gpus_per_process = *k;
  g.process = a.integer("process").value_or(0);
  const std::string asked = "--gpus_per_process " + std::to_string(*k);
  if (visible_gpus <= 0)
    throw accel::usage_error(command + ": " + asked + " plans on a process's group of GPUs, but no GPU is visible (" +
                             accel::detail::describe_visible(visible) + "); " + no_gpu_hint);
  g.processes = visible_gpus / *k;
  if (g.processes == 0)
    throw accel::usage_error(command + ": " + asked + " needs " + std::to_string(*k) + " GPUs per process but only " +
                             accel::text::plural(visible_gpus, "GPU") + (visible_gpus == 1 ? " is" : " are") + " visible (" +
                             accel::detail::describe_visible(visible) + "); give --gpus_per_process " +
                             std::to_string(visible_gpus) + " or less");
  if (g.process >= g.processes)
    throw accel::usage_error(
        command + ": " + a.spelling("process") + " " + std::to_string(g.process) + " is out of range: " +
        accel::text::plural(visible_gpus, "visible GPU") + " hold " + accel::text::plural(g.processes, "process") + " of " +
        std::to_string(*k) + " GPUs" + (g.processes == 1 ? " (--process 0)" : " (--process 0 to " + std::to_string(g.processes - 1) + ")") +
        "; give one of those, or a smaller --gpus_per_process");
  accel::LaunchEnv env;
  env.local_rank = g.process;
  env.local_world_size = g.processes;
  g.devices = accel::choose_devices(env, visible_gpus, visible, {}, *k);
  for (const auto& d : g.devices) g.physical.push_back(visible.physical(d.index()));
  return g;
}

}  // namespace accel_cli
