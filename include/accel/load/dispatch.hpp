// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file dispatch.hpp
/// @brief load_checkpoint_and_dispatch: safetensors checkpoints onto GPUs, CPU and disk by device
///        map, returning a DispatchedModel (dispatched_model.hpp).
///
/// A load is two steps. plan_load (load_plan.hpp) is pure: from the validated shard headers, the
/// map and the options it decides every tensor's dtype, placement, storage and arena slot. The
/// executor (detail/load_executor.hpp) then carries the plan out: it maps the shards, makes every
/// allocation (one arena per device-map block, the fetch buffers), and per tensor in file order
/// reads, converts and places it. GPU tensors go through a ring of pinned staging buffers with
/// asynchronous copies, so the next disk read overlaps the current copy; CPU tensors are read
/// straight into their block's memory by several threads (LoadOptions::host_threads). A failure
/// anywhere frees everything allocated so far.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/model/names.hpp>
#include <accel/model/quantization.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/map_names.hpp>
#include <accel/runtime/text.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/dispatched_model.hpp>
#include <accel/load/load_plan.hpp>
#include <accel/load/detail/load_executor.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

// A quantized weight and its scales, zero points or quant state are one thing to a kernel: a map
// that puts them on different devices is refused, naming both (the planner never does that).
inline void require_quantized_together(const LoadPlan& plan, const QuantizedTensors& q, const Checkpoint& checkpoint) {
  std::vector<std::size_t> base(checkpoint.headers.size() + 1, 0);  // shard -> its first tensor's position
  for (std::size_t s = 0; s < checkpoint.headers.size(); ++s) base[s + 1] = base[s] + checkpoint.headers[s].tensors.size();
  std::unordered_map<std::string_view, const PlannedTensor*> first;  // quantized module -> its first tensor
  for (const auto& t : plan.tensors) {
    const std::size_t n = base[t.location.shard] + t.location.entry;
    if (n >= q.stored.size() || !q.stored[n]) continue;
    const auto [it, fresh] = first.emplace(quant_owner(t.name).first, &t);
    if (!fresh && it->second->placement != t.placement)
      throw_error<config_error>("the device map puts '", it->second->name, "' on ", it->second->placement.to_string(), " and '",
                                t.name, "' on ", t.placement.to_string(), "; a quantized weight and its scales must share a "
                                "device: map their module '", it->first, "' (or a module holding it) as a whole");
  }
}

// LoadOptions::naming must describe this checkpoint: the same tensor names in the same order
// (views of the same headers compare by address, so a plan's own checkpoint costs no string compare).
inline void require_naming_of(const CheckpointNaming& naming, const Checkpoint& checkpoint) {
  const auto& names = naming.names.checkpoint;
  const auto& held = checkpoint.tensor_names;
  std::size_t differs = names.size() == held.size() ? names.size() : std::min(names.size(), held.size());
  for (std::size_t i = 0; i < std::min(names.size(), held.size()); ++i)
    if (names[i].data() != held[i].data() && names[i] != held[i]) {
      differs = i;
      break;
    }
  if (differs == names.size() && names.size() == held.size()) return;
  throw_error<usage_error>(
      "the plan was made for another checkpoint (", text::plural(static_cast<long long>(names.size()), "tensor"), ", this one has ",
      held.size(),
      differs < std::min(names.size(), held.size())
          ? concat("; tensor ", differs, " is '", text::printable(names[differs]), "' there and '", text::printable(held[differs]), "' here")
          : std::string(),
      "); plan this checkpoint (plan_auto_dispatch, plan_pipeline_load) or leave LoadOptions::naming unset");
}

// What a load decides before it touches a byte: the plan, the options it runs with, the GPUs.
struct DispatchDecision {
  LoadPlan plan;
  LoadOptions options;
  std::vector<DeviceMemoryPtr> devices;
};

// A map in the model's names (what accel plan writes by default and from_pretrained takes) is read
// in the checkpoint's; a quantized checkpoint's quantized tensors are loaded as stored. The names
// and the quantization come from LoadOptions::naming when the planner worked them out, else from
// config.json here.
inline DispatchDecision decide_dispatch(const Checkpoint& checkpoint, const DeviceMap& map, const LoadOptions& options) {
  DispatchDecision d{{}, options, options.devices ? *options.devices : cuda_device_memories()};
  LoadOptions& opts = d.options;
  if (opts.naming) require_naming_of(*opts.naming, checkpoint);
  else opts.naming = std::make_shared<const CheckpointNaming>(checkpoint_naming(checkpoint, options.config_file));
  const CheckpointNaming& naming = *opts.naming;
  const MapNames names = opts.map_names ? *opts.map_names : detect_map_names(map, naming.names);
  if (naming.quantization)
    for (const auto& k : naming.quantization->config.keep_in_fp32)
      if (std::find(opts.keep_in_fp32.begin(), opts.keep_in_fp32.end(), k) == opts.keep_in_fp32.end()) opts.keep_in_fp32.push_back(k);
  d.plan = plan_load(checkpoint, names == MapNames::model ? to_checkpoint_names(map, naming.names) : map, opts, d.devices.size());
  if (naming.quantization) require_quantized_together(d.plan, *naming.quantization, checkpoint);
  return d;
}

// Plan, then carry the plan out; `start` is when the caller's load began.
inline DispatchedModel plan_and_load(const Checkpoint& checkpoint, const DeviceMap& map, const LoadOptions& options,
                                     std::chrono::steady_clock::time_point start) {
  auto d = decide_dispatch(checkpoint, map, options);
  return LoadExecutor(checkpoint, std::move(d.plan), std::move(d.devices), d.options, start).run();
}

}  // namespace detail

/// @brief Loads a safetensors checkpoint onto the devices of a device map.
/// @param checkpoint a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding them
/// @param map module/tensor → GPU index, "cpu" or "disk" (HF device map), in the model's names
///        (transformers 5's, as accel plan writes them) or the checkpoint's (map_names.hpp tells)
/// @param options dtype, keep-in-fp32, strictness, cpu memory kind, offload folder, devices, staging
/// @return the dispatched model
/// @throws accel::checkpoint_error for any invalid header/index (before any allocation), a file
///         that changes under the loader, or strict-mode missing/unexpected tensors
/// @throws accel::unavailable_error when the map names an absent GPU
/// @throws accel::cuda_error when a device runs out of memory (everything allocated is freed)
/// @throws accel::usage_error for unsupported dtype changes, a missing offload folder, or
///         LoadOptions::naming made for another checkpoint
/// @note blocking; draws a progress bar on stderr when it is a terminal and options.progress is set
/// @code
/// auto map = accel::DeviceMap::from_json(R"({"model.embed": 0, "model.layers": 0, "lm_head": "cpu"})");
/// auto model = accel::load_checkpoint_and_dispatch("ckpt/", map, {.dtype = accel::DType::F16});
/// const auto& w = model.at("model.layers.0.mlp.up_proj.weight");   // w.device_ptr on GPU 0
/// @endcode
[[nodiscard]] inline DispatchedModel load_checkpoint_and_dispatch(const std::filesystem::path& checkpoint,
                                                                 const DeviceMap& map, const LoadOptions& options = {}) {
  const auto start = std::chrono::steady_clock::now();
  return detail::plan_and_load(resolve_checkpoint(checkpoint), map, options, start);
}

/// @brief As above, for a checkpoint already resolved (its headers validated) by resolve_checkpoint.
/// @note LoadReport::seconds counts from this call: the header reads before it are not included
[[nodiscard]] inline DispatchedModel load_checkpoint_and_dispatch(const Checkpoint& checkpoint, const DeviceMap& map,
                                                                 const LoadOptions& options = {}) {
  return detail::plan_and_load(checkpoint, map, options, std::chrono::steady_clock::now());
}

ACCEL_NAMESPACE_END
