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
};

/// @brief The size accounting the planner uses for these options (dtype, special dtypes, fp32 modules).
inline SizeOptions size_options(const PlanOptions& o) {
  return SizeOptions{o.dtype, o.special_dtypes, o.keep_in_fp32, o.accelerate_dtype_rule};
}

ACCEL_NAMESPACE_END
