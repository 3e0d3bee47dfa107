// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file planner.hpp
/// @brief infer_auto_device_map, get_balanced_memory and the auto/balanced/balanced_low_0/
///        sequential modes: which module goes to which GPU, to CPU or to disk.
///
/// The placement follows accelerate's greedy single pass (devices GPUs → cpu → disk; room for the
/// largest remaining layer kept on the first GPU and on CPU; tied tensors placed together; a
/// module that does not fit is replaced by its direct tensors and children unless it is a
/// no-split block; optional fallback; cleaning), with its defects fixed:
/// - tie containment is a prefix test on the tree (module `0` does not contain `10.weight`);
/// - a split module's direct parameters *and buffers* stay in the queue, so every tensor is mapped;
/// - the size with ties counts each partner entry once;
/// - the largest-layer reserve is always the largest layer still waiting (never stale);
/// - output keys are in model order; everything is O(n log n).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/model/dtype.hpp>
#include <accel/runtime/error.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/detail/placement_engine.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/plan_options.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {
// The planner's entry points that take precomputed sizes check that they belong to the tree.
inline void require_sizes_of(const ModuleTree& tree, const ModuleSizes& sizes) {
  if (sizes.module.size() != tree.modules().size() || sizes.tensor.size() != tree.tensors().size())
    throw_error<usage_error>("module sizes for ", sizes.module.size(), " modules and ", sizes.tensor.size(),
                             " tensors do not belong to this tree (", tree.modules().size(), " modules, ",
                             tree.tensors().size(), " tensors); pass compute_module_sizes(tree, size_options(opts))");
}

// The GPUs balancing spreads the model over: those with a non-zero budget, in budget order.
inline std::vector<int> gpus_to_balance(const MaxMemory& max_memory) {
  std::vector<int> gpus;
  for (const auto& [i, b] : max_memory.gpus)
    if (b > 0) gpus.push_back(i);
  return gpus;
}

// Nothing to balance over fewer than two GPUs; a single defaulted budget keeps 90 %.
inline MaxMemory budgets_without_balancing(MaxMemory out, const std::vector<int>& gpus, bool budgets_defaulted) {
  if (gpus.size() == 1 && budgets_defaulted)
    out.gpus[gpus[0]] = static_cast<std::uint64_t>(static_cast<double>(out.gpus[gpus[0]]) * 0.9);
  return out;
}

// The largest no-split block: a depth-first walk that stops at blocks (a block nested in another
// is never larger than it).
inline std::uint64_t largest_block(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts) {
  const NoSplitRule rule{opts.no_split, opts.auto_no_split};
  const auto& mods = tree.modules();
  std::uint64_t block = 0;
  std::vector<std::size_t> stack{0};
  while (!stack.empty()) {
    const auto m = stack.back();
    stack.pop_back();
    if (rule.matches(tree, m)) {
      block = std::max(block, sizes.module[m]);
      continue;
    }
    for (auto c : mods[m].children) stack.push_back(c);
  }
  return block;
}

// The mean size of the "final" modules: modules holding tensors none of whose child modules
// does (root excluded).
inline std::uint64_t mean_final_module(const ModuleTree& tree, const ModuleSizes& sizes) {
  const auto index = tree.index();
  const auto& ix = *index;
  const auto& mods = tree.modules();
  std::vector<bool> has_entry(mods.size(), false), child_entry(mods.size(), false);
  for (std::size_t t = 0; t < ix.canonical.size(); ++t)
    if (ix.canonical[t] == t)
      for (auto m = ix.tensor_module[t]; m != UINT32_MAX && !has_entry[m]; m = ix.module_parent[m]) has_entry[m] = true;
  for (std::size_t m = 1; m < mods.size(); ++m)
    if (has_entry[m]) child_entry[ix.module_parent[m]] = true;
  std::uint64_t sum = 0, count = 0;
  for (std::size_t m = 1; m < mods.size(); ++m) {
    if (!has_entry[m] || child_entry[m]) continue;
    sum += sizes.module[m];
    ++count;
  }
  return count ? sum / count : 0;
}

// transformers' "biggest leaf": the largest sum of one module's direct tensors (root excluded).
inline std::uint64_t largest_direct_tensors(const ModuleTree& tree, const ModuleSizes& sizes) {
  const auto& mods = tree.modules();
  std::uint64_t best = 0;
  for (std::size_t m = 1; m < mods.size(); ++m) {
    std::uint64_t direct = sizes.module[m];
    for (auto c : mods[m].children) direct -= sizes.module[c];
    best = std::max(best, direct);
  }
  return best;
}

// get_balanced_memory's share per GPU: total / n (n − 1 with low_zero) + int(1.25 × allowance).
struct BalancedShare {
  std::uint64_t total = 0, block = 0, leaf = 0, per_gpu = 0;
  std::uint64_t divisor = 1;
};
inline BalancedShare balanced_share(const ModuleTree& tree, const ModuleSizes& sizes, std::size_t gpu_count,
                                    const PlanOptions& opts, bool low_zero) {
  BalancedShare s;
  s.total = sizes.total();
  s.divisor = static_cast<std::uint64_t>(low_zero ? gpu_count - 1 : gpu_count);
  s.block = largest_block(tree, sizes, opts);
  s.leaf = opts.rules == PlanRules::transformers ? largest_direct_tensors(tree, sizes) : mean_final_module(tree, sizes);
  s.per_gpu = s.total / s.divisor + static_cast<std::uint64_t>(1.25 * static_cast<double>(std::max(s.block, s.leaf)));
  return s;
}
}  // namespace detail

/// @brief Balanced per-GPU budgets (accelerate's get_balanced_memory), from module sizes already
///        computed.
///
/// Each GPU but the last gets min(budget, total/n + allowance), allowance = int(1.25 × max(largest
/// no-split block, mean size of the modules holding only tensors)) (PlanRules::transformers:
/// the largest sum of one module's direct tensors instead of the mean); the last GPU keeps its
/// budget. With `low_zero`, GPU "0" (the first GPU) gets only what the others cannot hold.
/// With one GPU whose budget was defaulted (`budgets_defaulted`) it keeps 90 % of it.
/// @note accelerate takes the first module of each no-split class; accel takes the largest
///       no-split block (same value when blocks are equal; never smaller), and indexes GPUs by
///       their order, so ids need not be 0..n-1.
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @return the adjusted budgets (cpu and disk unchanged)
/// @throws accel::usage_error when `sizes` do not belong to `tree`
[[nodiscard]] inline MaxMemory get_balanced_memory(const ModuleTree& tree, const ModuleSizes& sizes,
                                                   const MaxMemory& max_memory, const PlanOptions& opts = {},
                                                   bool low_zero = false, bool budgets_defaulted = false) {
  detail::require_sizes_of(tree, sizes);
  MaxMemory out = max_memory;
  const auto gpus = detail::gpus_to_balance(out);
  if (gpus.size() < 2) return detail::budgets_without_balancing(std::move(out), gpus, budgets_defaulted);
  const std::uint64_t total = sizes.total();
  const std::uint64_t per_gpu = detail::balanced_share(tree, sizes, gpus.size(), opts, low_zero).per_gpu;
  for (std::size_t i = 0; i + 1 < gpus.size(); ++i) {
    auto& b = out.gpus[gpus[i]];
    if (low_zero && i == 0) continue;
    b = std::min(per_gpu, b);
  }
  if (low_zero) {
    std::uint64_t others = 0;
    for (std::size_t i = 1; i < gpus.size(); ++i) others += out.gpus[gpus[i]];
    auto& b0 = out.gpus[gpus[0]];
    b0 = std::min(b0, total > others ? total - others : 0);
  }
  return out;
}

/// @brief Balanced per-GPU budgets (accelerate's get_balanced_memory); see the overload above.
/// @return the adjusted budgets (cpu and disk unchanged)
[[nodiscard]] inline MaxMemory get_balanced_memory(const ModuleTree& tree, const MaxMemory& max_memory,
                                                   const PlanOptions& opts = {}, bool low_zero = false,
                                                   bool budgets_defaulted = false) {
  // Sizes matter only with two GPUs or more.
  if (const auto gpus = detail::gpus_to_balance(max_memory); gpus.size() < 2)
    return detail::budgets_without_balancing(max_memory, gpus, budgets_defaulted);
  return get_balanced_memory(tree, compute_module_sizes(tree, size_options(opts)), max_memory, opts, low_zero,
                             budgets_defaulted);
}

namespace detail {
// One line per GPU whose budget balancing lowered: from what to what, and why.
inline std::vector<std::string> explain_balancing(const ModuleTree& tree, const ModuleSizes& sizes, const MaxMemory& given,
                                                  const MaxMemory& used, const PlanOptions& opts, bool low_zero) {
  std::vector<std::string> out;
  const auto gpus = gpus_to_balance(given);
  std::optional<BalancedShare> share;
  if (gpus.size() >= 2) share = balanced_share(tree, sizes, gpus.size(), opts, low_zero);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    const auto before = given.gpus.at(gpus[i]), after = used.gpus.at(gpus[i]);
    if (after >= before) continue;
    std::string why;
    if (!share) {
      why = "the only GPU keeps 10% of a measured budget free for activations";
    } else if (low_zero && i == 0) {
      why = concat("balanced_low_0: GPU ", gpus[0], " gets only what the other GPUs cannot hold (model ",
                   text::format_bytes(share->total), ")");
    } else {
      why = concat("balanced share: model ", text::format_bytes(share->total), " / ", share->divisor, " GPUs + 1.25 x ",
                   text::format_bytes(std::max(share->block, share->leaf)),
                   share->block >= share->leaf ? " (largest no-split block)"
                                               : (opts.rules == PlanRules::transformers ? " (largest module's own tensors)"
                                                                                        : " (mean final module)"),
                   ", so every GPU gets a part; the last GPU keeps its budget");
    }
    out.push_back(concat("GPU ", gpus[i], " budget lowered from ", text::format_bytes(before), " to ", text::format_bytes(after),
                         ": ", why));
  }
  return out;
}
}  // namespace detail

/// @brief Plans a device map from module sizes already computed (callers that need the sizes too,
///        as `accel plan` does for its drawing, compute them once).
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @throws as plan_device_map(tree, opts); accel::usage_error when `sizes` do not belong to `tree`
[[nodiscard]] inline PlanResult plan_device_map(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts) {
  detail::require_sizes_of(tree, sizes);
  auto result = detail::PlacementEngine(tree, opts, sizes).run();
  detail::plan_execution(tree, sizes, result, opts.max_memory, opts);
  return result;
}

/// @brief Plans a device map and returns it with per-device accounting and messages.
/// @param tree the model
/// @param opts budgets (required), no-split rules, dtype, flags
/// @return the map (model order, cleaned unless `clean_result` is false), the accounting and the
///         execution GPU with its fetch buffers (PlanResult::execution)
/// @throws accel::planning_error when some module fits on no device (disk forbidden or capped),
///         stating bytes needed vs available per device, or (with `require_fetch_room`) when no GPU
///         has room for a fetch buffer of the largest offloaded layer; accel::usage_error without budgets
/// @code
/// auto plan = accel::plan_device_map(tree, {.max_memory = accel::parse_max_memory("0=20GiB,cpu=64GiB"),
///                                           .no_split = {"LlamaDecoderLayer"}});
/// std::puts(plan.device_map.to_json_string().c_str());
/// @endcode
[[nodiscard]] inline PlanResult plan_device_map(const ModuleTree& tree, const PlanOptions& opts) {
  const auto sizes = compute_module_sizes(tree, size_options(opts));
  return plan_device_map(tree, sizes, opts);
}

/// @brief accelerate's infer_auto_device_map: the map only (see plan_device_map).
[[nodiscard]] inline DeviceMap infer_auto_device_map(const ModuleTree& tree, const PlanOptions& opts) {
  const auto sizes = compute_module_sizes(tree, size_options(opts));
  return detail::PlacementEngine(tree, opts, sizes).run().device_map;
}

/// @brief Plans with a string strategy from module sizes already computed; sizes serve both the
///        balancing and the placement. With PlanObjective::speed the fit map is planned first,
///        then plan_speed_objective within its budgets; the cheaper map is returned with
///        PlanResult::objectives set (the balancing lines are the fit plan's). The execution GPU's
///        room for fetch buffers (PlanResult::execution) is counted against the budgets as given
///        (times budget_scale): balancing spreads the weights, it does not shrink the GPUs.
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @throws as plan_device_map(tree, opts); accel::usage_error when `sizes` do not belong to `tree`
[[nodiscard]] inline PlanResult plan_device_map(const ModuleTree& tree, const ModuleSizes& sizes, DeviceMapMode mode,
                                                PlanOptions opts, bool budgets_defaulted = false) {
  detail::require_sizes_of(tree, sizes);
  const MaxMemory given = opts.max_memory;
  const bool low_zero = mode == DeviceMapMode::balanced_low_0;
  if (mode != DeviceMapMode::sequential)
    opts.max_memory = get_balanced_memory(tree, sizes, given, opts, low_zero, budgets_defaulted);
  const MaxMemory balanced = opts.max_memory;
  if (opts.budget_scale != 1.0) opts.max_memory = balanced.scaled(opts.budget_scale);
  auto result = detail::PlacementEngine(tree, opts, sizes).run();
  if (mode != DeviceMapMode::sequential) result.balancing = detail::explain_balancing(tree, sizes, given, balanced, opts, low_zero);
  if (opts.budget_scale != 1.0)
    result.balancing.push_back(detail::concat("every budget then multiplied by ", opts.budget_scale,
                                              " (the quantization's memory adjustment, as transformers makes it)"));
  if (opts.objective == PlanObjective::speed) {
    auto speed = plan_speed_objective(tree, sizes, opts, result);
    speed.plan.balancing = std::move(result.balancing);
    speed.plan.objectives = std::move(speed.comparison);
    result = std::move(speed.plan);
  }
  detail::plan_execution(tree, sizes, result, opts.budget_scale != 1.0 ? given.scaled(opts.budget_scale) : given, opts);
  return result;
}

/// @brief Plans with a string strategy: auto/balanced/balanced_low_0 first balance the budgets,
///        sequential uses them as given.
/// @param budgets_defaulted true when the budgets came from default_max_memory (enables the 10 %
///        single-GPU reserve of balanced modes, as accelerate)
[[nodiscard]] inline PlanResult plan_device_map(const ModuleTree& tree, DeviceMapMode mode, PlanOptions opts,
                                                bool budgets_defaulted = false) {
  const auto sizes = compute_module_sizes(tree, size_options(opts));
  return plan_device_map(tree, sizes, mode, std::move(opts), budgets_defaulted);
}

ACCEL_NAMESPACE_END
