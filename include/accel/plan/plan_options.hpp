// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file plan_options.hpp
/// @brief What the planner takes (PlanOptions, DeviceMapMode) and gives back (PlanResult).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/model/dtype.hpp>
#include <accel/runtime/error.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/model/module_tree.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief The string device-map strategies of transformers/accelerate.
enum class DeviceMapMode : std::uint8_t {
  automatic,       ///< "auto": same as balanced (as in accelerate today)
  balanced,        ///< "balanced": budgets from get_balanced_memory, then placement
  balanced_low_0,  ///< "balanced_low_0": balanced, keeping GPU 0 as empty as possible
  sequential,      ///< "sequential": budgets used as given, filling GPUs in order
};

/// @brief Parses "auto", "balanced", "balanced_low_0" or "sequential".
/// @throws accel::usage_error naming the string and the accepted ones
[[nodiscard]] inline DeviceMapMode parse_device_map_mode(std::string_view s) {
  if (s == "auto") return DeviceMapMode::automatic;
  if (s == "balanced") return DeviceMapMode::balanced;
  if (s == "balanced_low_0") return DeviceMapMode::balanced_low_0;
  if (s == "sequential") return DeviceMapMode::sequential;
  detail::throw_error<usage_error>("unknown device map mode '", s, "'; use auto, balanced, balanced_low_0 or sequential");
}

/// @brief Whose placement rules the planner follows where transformers and accelerate differ.
enum class PlanRules : std::uint8_t {
  /// accelerate's infer_auto_device_map / get_balanced_memory: balancing allowance from the first
  /// block of each no-split class and the mean size of the final modules.
  accelerate,
  /// transformers 5's from_pretrained(device_map=...) (its own copies of those functions): the
  /// allowance from the largest no-split block and the largest set of direct tensors of one module;
  /// the largest-layer reserve counts modules only and is refreshed as transformers refreshes it;
  /// a module that does not fit is split even when it would fit without its tied partners.
  transformers,
};

/// @brief What a device map is planned for.
enum class PlanObjective : std::uint8_t {
  /// "does it fit?": transformers' (or accelerate's) map exactly, as from_pretrained computes it.
  fit,
  /// the least weight traffic per forward pass within the same budgets: an untied input embedding
  /// leaves the GPUs first (its rows are read, not the table), the largest-layer reserve is kept
  /// only for layers that are actually offloaded, GPUs are packed fuller, cpu before disk. Never
  /// streams more than the fit map (both are computed; the better one is kept).
  speed,
};

/// @brief Parses "fit" or "speed".
/// @throws accel::usage_error naming the string and the accepted ones
[[nodiscard]] inline PlanObjective parse_plan_objective(std::string_view s) {
  if (s == "fit") return PlanObjective::fit;
  if (s == "speed") return PlanObjective::speed;
  detail::throw_error<usage_error>("unknown plan objective '", s, "'; use fit or speed");
}

/// @brief "fit" or "speed".
[[nodiscard]] constexpr std::string_view plan_objective_name(PlanObjective o) noexcept {
  return o == PlanObjective::speed ? "speed" : "fit";
}

/// @brief Transfer rates the streaming estimates assume (defaults, measured ones, or given ones).
struct Bandwidths {
  double host_to_device = 25e9;  ///< bytes/s pinned host → GPU (PCIe 4.0 x16 in practice ≈ 25 GB/s)
  double disk_read = 2e9;        ///< bytes/s reading the offload folder (a fast NVMe SSD ≈ 2 GB/s)
};

/// @brief Options of infer_auto_device_map / plan_device_map.
struct PlanOptions {
  MaxMemory max_memory{};                 ///< budgets (required): GPUs, optional cpu, optional disk cap
  std::vector<std::string> no_split{};    ///< class names or glob patterns of blocks never split
  bool auto_no_split = true;              ///< with no `no_split`: numbered children are blocks
  std::optional<DType> dtype{};           ///< load dtype of floating tensors (tensor_load_dtype); unset: stored
  bool accelerate_dtype_rule = false;     ///< size floating tensors as min(dtype, own), as accelerate does
                                          ///< (what is loaded is `dtype`, up or down: for comparisons only)
  PlanRules rules = PlanRules::accelerate;  ///< whose balancing and placement details to follow
  std::map<std::string, DType, std::less<>> special_dtypes{};  ///< exact tensor name → dtype
  double budget_scale = 1.0;              ///< budgets are multiplied by this after balancing, before
                                          ///< placement (a quantization's budget_factor, as transformers'
                                          ///< adjust_max_memory: bitsandbytes 0.9)
  std::vector<std::string> keep_in_fp32{};  ///< keep_in_fp32_matches patterns: tensors loaded as float32
  bool clean_result = true;               ///< merge keys with clean_device_map
  bool offload_buffers = false;           ///< offloaded modules' buffers are offloaded too (else they
                                          ///< stay resident on the execution device)
  bool fallback_allocation = false;       ///< when a main device would get nothing, look for a
                                          ///< smaller module that fits (accelerate's fallback)
  std::uint32_t gpu_reserve_layers = 1;   ///< largest layers the first GPU keeps room for: 1 is
                                          ///< accelerate's rule; accel's dispatch double-buffers
                                          ///< offloaded blocks (LoadOptions::fetch_slots = 2), so
                                          ///< plan with 2 to leave room for both fetch buffers
  std::ostream* verbose = nullptr;        ///< trace of every decision (accelerate's verbose lines)
  PlanObjective objective = PlanObjective::fit;  ///< fit: transformers' map, unchanged; speed: see
                                                 ///< PlanObjective (mode-taking plan_device_map only)
  Bandwidths bandwidths{};                ///< rates the speed objective weighs cpu against disk with
  bool require_fetch_room = false;        ///< refuse (planning_error) a map whose largest offloaded
                                          ///< layer fits the fetch-buffer room of no GPU
                                          ///< (PlanResult::execution); the loader's plans set it
};

/// @brief What one device received.
struct DevicePlan {
  Placement device{};                     ///< which device
  std::optional<std::uint64_t> budget{};  ///< its budget; unset = unbounded (disk)
  std::uint64_t placed = 0;               ///< bytes of weights placed on it
  std::uint64_t reserve = 0;              ///< largest-layer reserve held back when last considered
  std::uint64_t buffers = 0;              ///< buffer bytes of the modules placed on it
  bool main = false;                      ///< a main device (first GPU, cpu) that keeps the reserve
  std::vector<std::string> modules{};     ///< keys of the final map placed on it, model order
  std::optional<std::uint64_t> required{};  ///< it received nothing: bytes the first module needed
};

/// @brief Weight bytes that cross to the execution GPU on every forward pass, and their time.
///
/// Counted: weights on cpu (copied host → GPU) and on disk (read, then copied host → GPU), as
/// make_plan_report counts them; an offloaded module's buffers stay resident unless
/// offload_buffers. Not counted: an input embedding read by rows (row_read_embeddings: a pass
/// reads the rows of its token ids, a few KiB, counted as 0), activations, KV cache, kernel time,
/// overlap of copies with compute.
struct StreamingCost {
  std::uint64_t from_cpu = 0;   ///< bytes copied host → GPU per pass (0 without a GPU: it runs there)
  std::uint64_t from_disk = 0;  ///< bytes read from disk per pass
  std::uint64_t row_read = 0;   ///< bytes of row-read input embeddings off the GPUs (not streamed)
  double seconds = 0;           ///< from_cpu / host_to_device + from_disk / disk_read (+ / host_to_device with a GPU)
  /// @brief Bytes streamed per forward pass.
  [[nodiscard]] std::uint64_t streamed() const noexcept { return from_cpu + from_disk; }
};

/// @brief A module (or tensor) the speed objective placed elsewhere than the fit map, and why.
struct ModuleMove {
  std::string module{};  ///< a unit the planner moves whole (block, leaf module, loose tensor)
  Placement from{};      ///< its device in the fit map
  Placement to{};        ///< its device in the speed map
  std::string why{};     ///< e.g. "input embedding: rows are read, not the table"
};

/// @brief Both objectives' streaming cost for one model and one set of budgets.
struct ObjectiveComparison {
  StreamingCost fit{};                 ///< the fit map's
  StreamingCost speed{};               ///< the speed map's (the fit map's when no better one exists)
  bool speed_map_differs = false;      ///< the speed objective keeps a map other than the fit map
  std::vector<ModuleMove> moves{};     ///< what the speed map moved, model order (empty when it is the fit map)
  std::vector<std::string> row_read{}; ///< the tensors counted as read by rows
  Bandwidths bandwidths{};             ///< the rates the seconds assume
};

/// @brief Which GPU runs the layers a map leaves on cpu or disk, and the fetch buffers (each one
///        such layer, copied in for a forward pass) the plan kept room for there. The loader takes
///        both from here (LoadOptions::execution), never from the map alone.
///
/// The GPU is the one where the plan kept its largest-layer reserve (the first GPU of the budgets
/// for the fit objective, as transformers keeps it; the first GPU holding weights for the speed
/// objective), even when it holds no weights itself, if its budget as given (before balancing,
/// times budget_scale) less the weights placed on it holds the buffers; otherwise the first other
/// GPU with a budget that holds all of them, else the one holding the most. A map that places no
/// weight on any GPU runs on the CPU: no execution GPU, no fetch buffer.
struct ExecutionPlan {
  std::optional<int> gpu{};               ///< the execution GPU; unset: no GPU holds weights (runs on the CPU)
  std::uint32_t fetch_slots = 0;          ///< fetch buffers room was kept for on it (at most
                                          ///< gpu_reserve_layers; 0 when nothing is fetched, or when
                                          ///< no GPU has room for one: see loadable())
  std::uint64_t fetch_buffer_bytes = 0;   ///< bytes of each: the largest offloaded layer, every tensor
                                          ///< at a multiple of 256 bytes as the loader packs it
  std::string largest_offloaded_layer{};  ///< that layer (a tensor's name up to its first numeric
                                          ///< component, else its module: layer_of); "" when none
  /// @brief False when a layer must be fetched but no GPU has room for one buffer of it.
  [[nodiscard]] bool loadable() const noexcept { return !gpu || fetch_buffer_bytes == 0 || fetch_slots > 0; }
};

/// @brief A device map with its accounting.
struct PlanResult {
  DeviceMap device_map{};                 ///< HF device map, model order
  std::vector<DevicePlan> devices{};      ///< every candidate device, fill order
  MaxMemory budgets{};                    ///< the budgets used (after balancing)
  std::uint64_t total_bytes = 0;          ///< model size under the size options
  std::uint64_t largest_layer = 0;        ///< largest layer (block, leaf module or loose tensor)
  std::vector<std::string> warnings{};    ///< e.g. offloaded buffers that fit no GPU
  std::vector<std::string> info{};        ///< e.g. devices that received nothing
  std::vector<std::string> balancing{};   ///< balanced modes: each GPU budget lowered, from what to what and why
  PlanObjective objective = PlanObjective::fit;  ///< what the map was planned for
  std::optional<ObjectiveComparison> objectives{};  ///< PlanObjective::speed: both objectives' cost
  ExecutionPlan execution{};              ///< the execution GPU and its fetch buffers (the loader's)
};

/// @brief The size accounting the planner uses for these options (dtype, special dtypes, fp32 modules).
inline SizeOptions size_options(const PlanOptions& o) {
  return SizeOptions{o.dtype, o.special_dtypes, o.keep_in_fp32, o.accelerate_dtype_rule};
}

ACCEL_NAMESPACE_END
