// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file load_plan.hpp
/// @brief Load options and the pure load plan: for every checkpoint tensor its placement, device-map
///        block, load dtype, storage kind and arena slot, plus missing/unexpected tensors, decided
///        from headers and the device map before a single byte is allocated or read.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/load/convert.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/map_names.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/offload.hpp>
#include <accel/model/dtype.hpp>
#include <accel/runtime/error.hpp>
#include <accel/model/quantization.hpp>
#include <accel/model/safetensors.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief How tensors placed on `cpu` are held.
enum class CpuMemory : std::uint8_t {
  pageable,   ///< copied into ordinary host memory (default)
  pinned,     ///< copied into page-locked memory: the fastest source for fetch() (needs a GPU seam)
  zero_copy,  ///< views into the memory-mapped checkpoint when no conversion is needed, else pageable
};

/// @brief Where a loaded tensor's bytes are.
enum class Storage : std::uint8_t {
  device,         ///< GPU memory (device_ptr)
  host_pinned,    ///< pinned host memory
  host_pageable,  ///< pageable host memory
  mmap_view,      ///< a read-only view into the checkpoint shard (no copy)
  offload_file,   ///< a read-only view of an offload-folder `.dat` (converted dtype)
};

/// @brief "device", "pinned", "pageable", "mmap", "offload".
[[nodiscard]] constexpr std::string_view storage_name(Storage s) noexcept {
  switch (s) {
    case Storage::device: return "device";
    case Storage::host_pinned: return "pinned";
    case Storage::host_pageable: return "pageable";
    case Storage::mmap_view: return "mmap";
    case Storage::offload_file: return "offload";
  }
  return "?";
}

/// @brief Options of load_checkpoint_and_dispatch.
struct LoadOptions {
  /// Load dtype for floating tensors (F32/F16/BF16 only); integers and bools never change.
  std::optional<DType> dtype{};
  /// Patterns of tensors loaded as float32, matched as transformers matches keep-in-fp32 modules
  /// (keep_in_fp32_matches: anywhere in the name; the planner uses the same rule).
  std::vector<std::string> keep_in_fp32{};
  /// Checkpoint tensors loaded byte-exact in their stored dtype whatever `dtype` says: a quantized
  /// checkpoint's quantized weights and their scales (quantization.hpp). load_checkpoint_and_dispatch
  /// adds the ones config.json's quantization_config implies; list more here.
  std::vector<std::string> stored_dtype_tensors{};
  /// Offloaded tensors a forward pass reads only by rows (DispatchedModel::read_rows): an input
  /// embedding left off the GPUs. They do not size the fetch buffers (fetching one whole is then
  /// refused unless it fits a buffer). plan_auto_dispatch lists the row-read embeddings it moved
  /// off the GPUs for PlanObjective::speed, which plans no reserve for them.
  std::vector<std::string> row_read_tensors{};
  /// The model's tensor names (e.g. from a ModuleTree); when given, checkpoint tensors outside it
  /// are unexpected and listed names absent from the checkpoint are missing.
  std::vector<std::string> expected_tensors{};
  /// Tied names: {alias, source}; the alias resolves to the source's storage and is never missing.
  std::vector<std::pair<std::string, std::string>> tied{};
  /// Tensors loaded under a name of their own from another checkpoint tensor's bytes: {name,
  /// source}, the source in the checkpoint's names. The name is placed by the map's key covering it
  /// (skipped when none does). A pipeline stage holding a weight tied to one another stage holds
  /// (an LM head tied to the input embedding) loads its own copy this way (load_stage).
  std::vector<std::pair<std::string, std::string>> tied_copies{};
  /// The checkpoint's model names and quantization as the planner worked them out (CheckpointModel's
  /// `names` and `quantization`): the loader reads the map and the quantized tensors through them
  /// instead of reading config.json and classifying every tensor again. plan_auto_dispatch and
  /// plan_pipeline_load set it; unset: the loader works them out. It must be this checkpoint's (its
  /// tensor names are compared: a usage_error otherwise).
  std::shared_ptr<const CheckpointNaming> naming{};
  /// Which names the map's keys are in; unset: told from the keys (detect_map_names). A map the
  /// planner made for this checkpoint is in model names (plan_auto_dispatch sets it).
  std::optional<MapNames> map_names{};
  /// The model's config.json when it does not sit next to the checkpoint: its class's name rules
  /// let a map in the model's names be read (names.hpp). Unset: the one next to the checkpoint.
  std::optional<std::filesystem::path> config_file{};
  /// Missing or unexpected tensors are an error (otherwise reported and skipped).
  bool strict = false;
  /// How `cpu` tensors are held.
  CpuMemory cpu_memory = CpuMemory::pageable;
  /// Folder for disk-placed tensors whose dtype changes (others are views into the shards).
  std::filesystem::path offload_folder{};
  /// The GPUs (index i = GPU i); nullopt: every visible CUDA GPU. Tests pass host-simulated ones.
  std::optional<std::vector<DeviceMemoryPtr>> devices{};
  /// Size of each pinned staging buffer.
  std::uint64_t staging_bytes = std::uint64_t{32} << 20;
  /// Number of staging buffers per GPU (2 = double buffering).
  int staging_buffers = 2;
  /// Fetch buffers on the execution device, each the size of the largest offloaded layer (2: prefetch
  /// can fill one while the other is in use). Fewer are made, with a warning, when the device has no
  /// room for all; plan with PlanOptions::gpu_reserve_layers = fetch_slots to leave that room.
  int fetch_slots = 2;
  /// The plan's execution GPU and fetch buffers (PlanResult::execution; plan_auto_dispatch and
  /// `accel load` pass it): fetch() copies to that GPU, into exactly that many buffers (fetch_slots
  /// is then only what was asked: fewer are a warning), and a largest offloaded layer larger than
  /// the plan sized them for is refused (planning_error) before anything is allocated. Unset (a
  /// map made elsewhere): the lowest GPU of the map, with fetch_slots buffers.
  std::optional<ExecutionPlan> execution{};
  /// Threads that read (and convert) the tensors held in host memory, each taking 8 MiB at a time;
  /// 0: one per core, at most 8. Progress callbacks still run on the calling thread.
  unsigned host_threads = 0;
  /// Draw a progress bar on stderr (only when it is a terminal).
  bool progress = true;
  /// Called after each chunk with (bytes done, bytes total).
  std::function<void(std::uint64_t, std::uint64_t)> on_progress{};
};

/// @brief The plan for one checkpoint tensor.
struct PlannedTensor {
  std::string name;                  ///< checkpoint name
  TensorLocation location;           ///< shard and entry in the Checkpoint
  std::uint64_t file_offset = 0;     ///< where its bytes start in its shard file
  DType stored_dtype = DType::F32;   ///< dtype in the file
  DType dtype = DType::F32;          ///< dtype once loaded
  std::vector<std::int64_t> shape;   ///< dimensions
  std::uint64_t stored_bytes = 0;    ///< bytes in the file
  std::uint64_t bytes = 0;           ///< bytes once loaded
  Placement placement;               ///< from the device map
  std::string block;                 ///< the device-map key that placed it
  Storage storage = Storage::host_pageable;
  std::size_t arena = static_cast<std::size_t>(-1);  ///< index into LoadPlan::arenas (device/host storage)
  std::uint64_t arena_offset = 0;    ///< offset inside that arena
  /// @brief True when the loaded dtype differs from the file's.
  [[nodiscard]] bool converts() const noexcept { return dtype != stored_dtype; }
  /// @brief Number of elements (1 for a scalar).
  [[nodiscard]] std::uint64_t numel() const noexcept { return shape_numel(shape); }
};

/// @brief One allocation: all tensors of one device-map block that need memory.
struct PlannedArena {
  std::string block;     ///< device-map key
  Placement placement;   ///< GPU or cpu
  Storage storage = Storage::device;
  std::uint64_t bytes = 0;
};

/// @brief The whole plan.
struct LoadPlan {
  std::vector<PlannedTensor> tensors;        ///< checkpoint order (shard, then file offset), then LoadOptions::tied_copies
  std::vector<PlannedArena> arenas;          ///< in first-use order
  std::vector<std::string> unexpected;       ///< checkpoint tensors not loaded (no device, or not in the model)
  std::vector<std::string> missing;          ///< expected tensors the checkpoint lacks
  std::vector<std::string> unused_keys;      ///< device-map keys that cover no checkpoint tensor
  std::optional<int> execution_gpu;          ///< where fetch() brings weights: LoadOptions::execution's GPU,
                                             ///< else the lowest GPU of the map
  std::uint64_t largest_offloaded_layer = 0; ///< bytes of the biggest cpu/disk layer (detail::fetch_unit, aligned): fetch buffer size
  std::string largest_offloaded_unit;        ///< that layer's name (the fetch unit)
  int fetch_slots = 0;                       ///< fetch buffers to make (0 without a GPU or anything to fetch)
  std::uint64_t total_bytes = 0;             ///< bytes of every loaded tensor, once loaded
};

namespace detail {

/// @brief The unit fetch buffers are sized for, the one a forward pass fetches: the tensor's layer,
/// i.e. its name up to the first numeric component ("model.layers.3" for
/// "model.layers.3.mlp.up.weight"), else its module ("lm_head" for "lm_head.weight"); or the
/// device-map key covering it when that is deeper. The planner's largest-layer reserve counts the
/// same units (numbered children are blocks), so a plan's reserve holds one fetch buffer.
inline std::string_view fetch_unit(std::string_view tensor, std::string_view key) {
  const std::string_view unit = layer_of(tensor);
  return key.size() > unit.size() ? key : unit;
}

// A second device-map key covering `name` besides `covering` (a shorter prefix: a module and one
// of its children both in the map), or nullptr.
inline const DeviceMap::Entry* second_covering(const DeviceMap& map, const DeviceMap::Entry& covering) {
  if (covering.first.empty()) return nullptr;
  const auto dot = covering.first.rfind('.');
  return map.covering(std::string_view(covering.first).substr(0, dot == std::string::npos ? 0 : dot));
}

inline bool matches_prefix(std::string_view name, std::string_view key) {
  return name == key || key.empty() || (name.size() > key.size() && name.starts_with(key) && name[key.size()] == '.');
}

// Where a tensor's bytes live once loaded, from its placement and whether its dtype changes.
inline Storage storage_for(const PlannedTensor& t, const LoadOptions& options, std::size_t gpu_count) {
  if (t.placement.is_gpu()) return Storage::device;
  if (t.placement.is_disk()) return t.converts() ? Storage::offload_file : Storage::mmap_view;
  if (options.cpu_memory == CpuMemory::zero_copy && !t.converts()) return Storage::mmap_view;
  if (options.cpu_memory == CpuMemory::pinned && gpu_count > 0) return Storage::host_pinned;
  return Storage::host_pageable;
}

// One covered checkpoint tensor: its load dtype, placement and storage, checked against the GPUs
// and the options (every check a tensor can fail, in the order the messages promise).
inline PlannedTensor plan_tensor(const SafetensorsHeader& header, TensorLocation location, const DeviceMap::Entry& covering,
                                 const LoadOptions& options, std::size_t gpu_count, bool keep_stored) {
  const auto& entry = header.tensors[location.entry];
  PlannedTensor t;
  t.name = entry.name;
  t.location = location;
  t.file_offset = header.file_offset(entry);
  t.stored_dtype = entry.dtype;
  t.shape = entry.shape;
  t.stored_bytes = entry.size_bytes();
  t.block = covering.first;
  t.placement = covering.second;
  // The planner sizes with the same decision (tensor_load_dtype; quantized tensors as stored), so
  // plan and load agree.
  const DType wanted =
      keep_stored ? entry.dtype : tensor_load_dtype(entry.dtype, entry.name, LoadDTypeRule{options.dtype, options.keep_in_fp32});
  t.dtype = load_dtype(entry.dtype, wanted, false, entry.name);
  t.bytes = t.converts() ? tensor_bytes(t.dtype, entry.numel()).value_or(0) : t.stored_bytes;
  if (t.placement.is_gpu() && (t.placement.index < 0 || static_cast<std::size_t>(t.placement.index) >= gpu_count))
    throw_error<unavailable_error>("the device map places '", t.block, "' on GPU ", t.placement.index, " but ",
                                   gpu_count == 0 ? std::string("no GPU is") : concat("only ", gpu_count, " GPU(s) are"),
                                   " visible; fix the map or CUDA_VISIBLE_DEVICES");
  t.storage = storage_for(t, options, gpu_count);
  if (t.storage == Storage::offload_file)
    if (auto why = offload_name_problem(t.name))
      throw_error<checkpoint_error>("tensor '", text::printable(t.name), "' is placed on disk and converted, but its name cannot be "
                                    "an offload file name: ", *why, "; rename the tensor in the checkpoint or keep it "
                                    "off disk (or in its stored dtype)");
  if (t.storage == Storage::offload_file && options.offload_folder.empty())
    throw_error<usage_error>("tensor '", t.name, "' is placed on disk and converted from ", safetensors_name(t.stored_dtype),
                             " to ", safetensors_name(t.dtype), ", which needs an offload folder; set "
                             "LoadOptions::offload_folder (accel load --offload-folder DIR)");
  return t;
}

// Arenas: one per block and storage kind for the tensors that need memory, offsets aligned for any dtype.
inline void pack_arenas(LoadPlan& plan) {
  std::map<std::string, std::size_t> arena_of_block;
  std::vector<std::vector<std::size_t>> members;
  for (std::size_t ti = 0; ti < plan.tensors.size(); ++ti) {
    auto& t = plan.tensors[ti];
    if (t.storage != Storage::device && t.storage != Storage::host_pinned && t.storage != Storage::host_pageable) continue;
    auto [it, fresh] = arena_of_block.emplace(t.block + '\x1f' + storage_name(t.storage).data(), plan.arenas.size());
    if (fresh) {
      plan.arenas.push_back({t.block, t.placement, t.storage, 0});
      members.emplace_back();
    }
    t.arena = it->second;
    members[t.arena].push_back(ti);
  }
  for (std::size_t a = 0; a < plan.arenas.size(); ++a) {
    std::vector<std::uint64_t> sizes;
    for (auto ti : members[a]) sizes.push_back(plan.tensors[ti].bytes);
    const auto layout = arena_layout(sizes);
    plan.arenas[a].bytes = layout.total;
    for (std::size_t i = 0; i < members[a].size(); ++i) plan.tensors[members[a][i]].arena_offset = layout.offsets[i];
  }
}

// The largest fetch unit held off the GPUs, its bytes packed as a fetch buffer packs it; tensors
// only read by rows do not count.
struct OffloadedUnit {
  std::string name;
  std::uint64_t bytes = 0;
};
inline OffloadedUnit largest_offloaded_unit(const std::vector<PlannedTensor>& tensors, const LoadOptions& options) {
  const std::unordered_set<std::string_view> row_read(options.row_read_tensors.begin(), options.row_read_tensors.end());
  std::map<std::string, std::vector<std::uint64_t>> sizes;
  for (const auto& t : tensors)
    if (!t.placement.is_gpu() && !row_read.count(t.name)) sizes[std::string(fetch_unit(t.name, t.block))].push_back(t.bytes);
  OffloadedUnit largest;
  for (const auto& [unit, s] : sizes)
    if (const auto bytes = arena_layout(s).total; bytes > largest.bytes) largest = {unit, bytes};
  return largest;
}

// The execution GPU and its fetch buffers: the plan's (LoadOptions::execution), checked against
// what this load offloads, else the lowest GPU of the map with fetch_slots buffers.
inline void plan_fetch_buffers(LoadPlan& plan, const DeviceMap& map, const LoadOptions& options, std::size_t gpu_count) {
  const auto largest = largest_offloaded_unit(plan.tensors, options);
  plan.largest_offloaded_layer = largest.bytes;
  plan.largest_offloaded_unit = largest.name;
  if (!options.execution) {
    for (const auto& [k, p] : map.entries())
      if (p.is_gpu() && (!plan.execution_gpu || p.index < *plan.execution_gpu)) plan.execution_gpu = p.index;
    plan.fetch_slots = plan.execution_gpu && largest.bytes ? std::max(options.fetch_slots, 1) : 0;
    return;
  }
  const ExecutionPlan& e = *options.execution;
  plan.execution_gpu = e.gpu;
  if (e.gpu && (*e.gpu < 0 || static_cast<std::size_t>(*e.gpu) >= gpu_count))
    throw_error<unavailable_error>("the plan runs offloaded layers on GPU ", *e.gpu, " but ",
                                   gpu_count == 0 ? std::string("no GPU is") : concat("only ", gpu_count, " GPU(s) are"),
                                   " visible; plan for the GPUs the load uses (LoadOptions::devices)");
  if (!e.gpu || largest.bytes == 0) return;
  if (e.fetch_slots == 0 || largest.bytes > e.fetch_buffer_bytes)
    throw_error<planning_error>(
        "layer '", largest.name, "' is loaded off the GPUs and needs a fetch buffer of ", largest.bytes, " bytes (",
        text::format_bytes(largest.bytes), ") on execution GPU ", *e.gpu, ", but the plan kept room for ",
        e.fetch_slots == 0 ? std::string("none") : concat(e.fetch_slots, " of ", e.fetch_buffer_bytes, " bytes"),
        e.fetch_slots == 0 ? concat(" (no GPU has room for its largest offloaded layer '", e.largest_offloaded_layer, "')")
                           : std::string(),
        "; plan the map for these budgets and load options (plan_auto_dispatch, accel load --device-map auto), "
        "or raise a GPU's budget");
  plan.fetch_slots = static_cast<int>(e.fetch_slots);
}

// Expected tensors neither loaded nor tied to a loaded one, in the order they were expected.
inline std::vector<std::string> missing_tensors(const std::vector<PlannedTensor>& tensors, const LoadOptions& options) {
  std::vector<std::string> missing;
  if (options.expected_tensors.empty()) return missing;
  std::unordered_set<std::string> loaded;
  for (const auto& t : tensors) loaded.insert(t.name);
  std::unordered_map<std::string, std::string> alias_source;
  for (const auto& [alias, source] : options.tied) alias_source.emplace(alias, source);
  for (const auto& name : options.expected_tensors) {
    if (loaded.count(name)) continue;
    auto a = alias_source.find(name);
    if (a != alias_source.end() && loaded.count(a->second)) continue;
    missing.push_back(name);
  }
  return missing;
}

inline void refuse_mismatch_when_strict(const LoadPlan& plan, const LoadOptions& options) {
  if (!options.strict || (plan.missing.empty() && plan.unexpected.empty())) return;
  throw_error<checkpoint_error>(
      "strict loading failed: ", plan.missing.size(), " missing tensor(s)",
      plan.missing.empty() ? std::string() : " (" + text::quoted_list(plan.missing) + ")", " and ", plan.unexpected.size(),
      " unexpected tensor(s)", plan.unexpected.empty() ? std::string() : " (" + text::quoted_list(plan.unexpected) + ")",
      "; the checkpoint does not match the model or the device map does not cover it (turn strict off to skip them)");
}

}  // namespace detail

/// @brief Decides how every checkpoint tensor is loaded (a pure function: nothing is read or allocated).
/// @param checkpoint headers from resolve_checkpoint
/// @param map the device map (keys are tensor names or dotted prefixes; "" covers everything)
/// @param options dtype, keep-in-fp32, expected tensors, tied copies, cpu memory kind, offload folder
/// @param gpu_count GPUs available (indexes 0 .. gpu_count-1)
/// @return the plan
/// @throws accel::unavailable_error when the map (or LoadOptions::execution) names a GPU index >= gpu_count
/// @throws accel::planning_error when LoadOptions::execution kept no room, or too little, for the
///         largest layer this load leaves off the GPUs
/// @throws accel::checkpoint_error in strict mode when tensors are missing or unexpected
/// @throws accel::usage_error when a dtype change is unsupported, disk tensors need conversion
///         and no offload folder is given, or a tied copy's source is not in the checkpoint
[[nodiscard]] inline LoadPlan plan_load(const Checkpoint& checkpoint, const DeviceMap& map, const LoadOptions& options,
                                        std::size_t gpu_count) {
  LoadPlan plan;
  const std::unordered_set<std::string_view> expected(options.expected_tensors.begin(), options.expected_tensors.end());
  const std::unordered_set<std::string_view> stored(options.stored_dtype_tensors.begin(), options.stored_dtype_tensors.end());
  // The quantization's stored tensors by checkpoint position (LoadOptions::naming), no name lookup.
  const std::vector<bool>* stored_at =
      options.naming && options.naming->quantization ? &options.naming->quantization->stored : nullptr;
  std::unordered_set<std::string_view> used_keys;
  for (std::size_t s = 0, n = 0; s < checkpoint.headers.size(); ++s) {
    const auto& header = checkpoint.headers[s];
    for (std::size_t e = 0; e < header.tensors.size(); ++e, ++n) {
      const auto& name = header.tensors[e].name;
      const DeviceMap::Entry* covering = map.covering(name);
      if (!covering || (!expected.empty() && !expected.count(name))) {
        plan.unexpected.emplace_back(name);
        continue;
      }
      if (const auto* outer = detail::second_covering(map, *covering); outer && outer->second != covering->second)
        detail::throw_error<config_error>("device map keys '", text::excerpt(outer->first), "' (", outer->second.to_string(), ") and '",
                                  text::excerpt(covering->first), "' (", covering->second.to_string(),
                                  ") both cover tensor '", text::printable(name), "'; a module and its child cannot go to "
                                  "different devices: remove one key or split the outer module into its children");
      used_keys.insert(covering->first);
      const bool keep_stored = (stored_at && n < stored_at->size() && (*stored_at)[n]) || stored.count(name) > 0;
      plan.tensors.push_back(detail::plan_tensor(header, {s, e}, *covering, options, gpu_count, keep_stored));
      plan.total_bytes += plan.tensors.back().bytes;
    }
  }
  for (const auto& [name, source] : options.tied_copies) {
    const DeviceMap::Entry* covering = map.covering(name);
    if (!covering) continue;
    const TensorLocation* at = checkpoint.find(source);
    if (!at)
      detail::throw_error<usage_error>("tied copy '", text::printable(name), "' is to be loaded from '", text::printable(source),
                                       "', which the checkpoint lacks; name a tensor it holds (LoadOptions::tied_copies)");
    used_keys.insert(covering->first);
    const std::size_t n = static_cast<std::size_t>(at - checkpoint.locations.data());
    const bool keep_stored = (stored_at && n < stored_at->size() && (*stored_at)[n]) || stored.count(source) > 0;
    auto t = detail::plan_tensor(checkpoint.headers[at->shard], *at, *covering, options, gpu_count, keep_stored);
    t.name = name;  // its own tensor, the bytes of `source`
    plan.total_bytes += t.bytes;
    plan.tensors.push_back(std::move(t));
  }
  detail::pack_arenas(plan);
  detail::plan_fetch_buffers(plan, map, options, gpu_count);
  for (const auto& [k, p] : map.entries())
    if (!used_keys.count(k)) plan.unused_keys.push_back(k);
  plan.missing = detail::missing_tensors(plan.tensors, options);
  detail::refuse_mismatch_when_strict(plan, options);
  return plan;
}

ACCEL_NAMESPACE_END
