// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file pipeline_plan.hpp
/// @brief plan_pipeline: the model's execution order cut into S contiguous stages, one per process
///        of a replica, balanced for the slowest stage's estimated time, each stage placed on its
///        process's GPUs, CPU and disk by the planner.
///
/// A stage is a run of whole units of the execution order (no-split blocks, modules without
/// children, tensors of split modules: what the planner moves whole), so no block is ever split.
/// Its time per forward pass is the speed objective's cost model plus the reads of the weights it
/// keeps: GPU-resident bytes at the GPU's read rate, cpu and disk bytes streamed at their rates
/// (streaming_cost), row-read input embeddings free. The split minimises the slowest stage (an
/// exact search over contiguous splits, then the most even among the optimal ones), then the
/// planner places each stage under its own process's budgets. A tensor tied across stages (an
/// input embedding and the LM head) is held by every stage that uses it, each its own copy.
/// Everything here is a pure function of its inputs: every rank computes the same plan.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/plan/planner.hpp>
#include <accel/plan/detail/contiguous_split.hpp>
#include <accel/plan/detail/stage_units.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief What plan_pipeline takes beside the planner's options.
struct PipelineOptions {
  int stages = 1;  ///< S: processes per replica, one stage each
  /// Budgets of each stage's process (GPU keys index its own group, 0 = its first GPU; cpu and disk
  /// its share), in stage order; empty: PlanOptions::max_memory for every stage.
  std::vector<MaxMemory> stage_budgets{};
  DeviceMapMode mode = DeviceMapMode::automatic;  ///< how each stage is placed on its process's devices
  bool budgets_defaulted = false;                 ///< the budgets were measured (plan_device_map's flag)
  double gpu_read = 2e12;  ///< bytes/s a GPU reads its resident weights at (HBM; 2 TB/s)
  double cpu_read = 5e10;  ///< bytes/s a process without a GPU reads its weights at (host memory; 50 GB/s)
};

/// @brief One stage: its units, where its weights go on its process, and its estimated time.
struct PipelineStage {
  std::size_t first_unit = 0;        ///< its units are PipelinePlan::units[first_unit, end_unit)
  std::size_t end_unit = 0;          ///< one past its last unit
  PlanResult plan{};                 ///< its device map (keys name only its own modules and tensors;
                                     ///< GPU keys index its process's group) and accounting
  std::uint64_t bytes = 0;           ///< weights it holds (a tied tensor's copy included)
  std::uint64_t gpu_bytes = 0;       ///< of those, on its GPUs
  std::uint64_t cpu_bytes = 0;       ///< on cpu
  std::uint64_t disk_bytes = 0;      ///< on disk
  StreamingCost streamed{};          ///< what it streams to its GPU per forward pass
  double seconds = 0;                ///< estimated time per forward pass (resident reads + streaming)
  std::vector<std::string> tied_copies{};  ///< its names of tensors tied to names in other stages,
                                           ///< with those ("lm_head.weight (tied to model.embed_tokens.weight
                                           ///< in stage 0)"): it holds its own copy
};

/// @brief A split judged under the same cost model: boundaries and each stage's estimated seconds.
struct StageSplit {
  std::vector<std::size_t> bounds{};  ///< stages + 1 unit indices, 0 first, the unit count last
  std::vector<double> seconds{};      ///< per stage, after placement
  double imbalance = 0;               ///< slowest / mean (0 when it does not fit)
  std::string problem{};              ///< why it cannot be placed ("" when it can)
};

/// @brief The stages of one replica (every replica's are the same).
struct PipelinePlan {
  std::vector<std::string> units{};      ///< the units of the execution order (device-map keys), model order
  std::vector<PipelineStage> stages{};   ///< in order: stage s runs after stage s - 1
  double imbalance = 1;                  ///< slowest stage / mean stage (1: perfectly even)
  /// The baseline: units split to balance parameter counts (accelerate's split_points="auto"),
  /// placed and timed as the stages are.
  StageSplit by_parameters{};
  bool parameter_split_kept = false;     ///< the baseline's split was faster once placed, so it is the plan's
  Bandwidths bandwidths{};               ///< streaming rates the seconds assume
  double gpu_read = 0;                   ///< GPU read rate the seconds assume
  double cpu_read = 0;                   ///< host read rate the seconds assume (stages without GPUs)

  /// @brief The slowest stage's estimated seconds.
  [[nodiscard]] double slowest() const noexcept {
    double s = 0;
    for (const auto& st : stages) s = std::max(s, st.seconds);
    return s;
  }
  /// @brief Weights held over all stages (tied copies counted in each stage that holds one).
  [[nodiscard]] std::uint64_t total_bytes() const noexcept {
    std::uint64_t b = 0;
    for (const auto& st : stages) b += st.bytes;
    return b;
  }
};

namespace detail {

inline double imbalance_of(const std::vector<double>& seconds) {
  if (seconds.empty()) return 0;
  const double sum = std::accumulate(seconds.begin(), seconds.end(), 0.0);
  const double mean = sum / static_cast<double>(seconds.size());
  return mean > 0 ? *std::max_element(seconds.begin(), seconds.end()) / mean : 1.0;
}

// The stage's map with keys naming only its own modules and tensors: a key the planner merged up
// to a module that reaches past the stage in the full model ("" or "model") is replaced by the
// keys below it.
inline DeviceMap stage_keys(const ModuleTree& full, const ModuleTree& sub, const DeviceMap& map) {
  auto counts = [](const ModuleTree& t) {
    std::vector<std::size_t> n(t.modules().size(), 0);
    for (const auto& ten : t.tensors()) ++n[ten.module];
    for (std::size_t m = t.modules().size(); m-- > 1;) n[t.modules()[m].parent] += n[m];
    return n;
  };
  const auto full_count = counts(full), sub_count = counts(sub);
  DeviceMap out;
  std::function<void(std::size_t, Placement)> expand = [&](std::size_t m, Placement p) {
    const auto& mod = sub.modules()[m];
    if (m != 0)
      if (const auto fm = full.find_module(mod.name); fm && full_count[*fm] == sub_count[m]) {
        out.set(mod.name, p);
        return;
      }
    for (auto t : mod.parameters) out.set(sub.tensors()[t].name, p);
    for (auto c : mod.children) expand(c, p);
    for (auto t : mod.buffers) out.set(sub.tensors()[t].name, p);
  };
  for (const auto& [key, where] : map) {
    if (const auto m = sub.find_module(key)) expand(*m, where);
    else out.set(key, where);
  }
  return out;
}

// Estimated seconds of a placed stage: weights resident on its GPUs (or, without one, in host
// memory) read once, what streams at the streaming rates; row-read embeddings free.
inline double placed_stage_seconds(const ModuleTree& sub, const ModuleSizes& sizes, const DeviceMap& map, const PlanOptions& opts,
                                   const PipelineOptions& p, StreamingCost& streamed) {
  const auto row_read = row_read_embeddings(sub);
  streamed = streaming_cost(sub, sizes, map, opts, row_read);
  const auto index = sub.index();
  const auto placements = map.devices();
  const bool gpu = std::any_of(placements.begin(), placements.end(), [](const Placement& x) { return x.is_gpu(); });
  std::uint64_t resident = 0;
  for (std::size_t t = 0; t < sub.tensors().size(); ++t) {
    if (index->canonical[t] != t || row_read[t]) continue;
    const auto& ten = sub.tensors()[t];
    const auto where = map.placement_of(ten.name);
    if (!where) continue;
    const bool stays = ten.buffer && !opts.offload_buffers;  // offloaded modules' buffers stay on the execution device
    if (gpu ? (where->is_gpu() || stays) : where->is_cpu()) resident += sizes.tensor[t];
  }
  return static_cast<double>(resident) / (gpu ? p.gpu_read : p.cpu_read) + streamed.seconds;
}

inline std::string describe_units(const StageUnits& units, std::size_t i, std::size_t j) {
  const auto& u = units.units();
  return concat(u[i].name, i + 1 < j ? " .. " + u[j - 1].name : std::string(), ", ", text::plural(static_cast<long long>(j - i), "unit"));
}

// "needs X but its process holds G on GPUs, C on cpu and D on disk (budgets)", and what the
// planner keeps free of those when the stage spills (estimate_stage_seconds' reserves), so the
// numbers add up.
inline std::string describe_fit(const StageUnits& units, std::size_t i, std::size_t j, const StageCapacity& c, const MaxMemory& budgets,
                                std::uint32_t reserve_layers) {
  const auto r = units.load(i, j);
  const auto f = stage_fit(r, c, reserve_layers);
  std::string s = concat("needs ", text::format_bytes(r.bytes), " but its process holds ", text::format_bytes(c.gpu), " on GPUs, ",
                         c.cpu ? text::format_bytes(*c.cpu) : std::string("nothing"), " on cpu and ",
                         c.disk ? text::format_bytes(*c.disk) : std::string("no limit"), " on disk (", budgets.to_string(), ")");
  if (f.gpu_reserve == 0 && f.cpu_reserve == 0) return s;
  std::size_t big = i;  // the largest unit (with its tied tensors)
  for (std::size_t u = i; u < j; ++u)
    if (units.units()[u].largest > units.units()[big].largest) big = u;
  const std::string which = concat(reserve_layers > 1 ? concat(reserve_layers, " x ") : std::string(), "its largest unit (",
                                   units.units()[big].name, ", ", text::format_bytes(r.largest), ")");
  s += "; spilling, it keeps ";
  if (f.gpu_reserve) s += concat(text::format_bytes(f.gpu_reserve), " of the GPUs free for ", which, " to run from");
  if (f.cpu_reserve)
    s += concat(f.gpu_reserve ? " and " : "", text::format_bytes(f.cpu_reserve), " of cpu free for its largest unit (",
                units.units()[big].name, ") as some goes to disk");
  const std::uint64_t room = c.gpu - f.gpu_reserve + c.cpu.value_or(0) - f.cpu_reserve + c.disk.value_or(0);
  return s + concat(", which leaves room for ", text::format_bytes(room));
}

// Places every stage of `bounds` on its process; throws planning_error naming the stage that does not fit.
inline std::vector<PipelineStage> place_stages(const ModuleTree& tree, const StageUnits& units, const std::vector<std::size_t>& bounds,
                                               const std::vector<MaxMemory>& budgets, const PlanOptions& opts,
                                               const PipelineOptions& p) {
  std::vector<PipelineStage> out;
  const auto stage_of_unit = [&](std::size_t u) {
    return static_cast<std::size_t>(std::upper_bound(bounds.begin(), bounds.end(), u) - bounds.begin()) - 1;
  };
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    PipelineStage st;
    st.first_unit = bounds[k];
    st.end_unit = bounds[k + 1];
    const auto sub = stage_tree(tree, units, st.first_unit, st.end_unit);
    PlanOptions o = opts;
    o.max_memory = budgets[k];
    o.verbose = nullptr;
    const auto sizes = compute_module_sizes(sub, size_options(o));
    try {
      st.plan = plan_device_map(sub, sizes, p.mode, o, p.budgets_defaulted);
    } catch (const planning_error& e) {
      throw_error<planning_error>("stage ", k, " (", describe_units(units, st.first_unit, st.end_unit), ", ",
                                  text::format_bytes(sizes.total()), ") does not fit its process's budgets (",
                                  budgets[k].to_string(), "): ", message_body(e));
    }
    st.plan.device_map = stage_keys(tree, sub, st.plan.device_map);
    for (auto& d : st.plan.devices) {
      d.modules.clear();
      for (const auto& [key, where] : st.plan.device_map)
        if (where == d.device) d.modules.push_back(key);
      (d.device.is_gpu() ? st.gpu_bytes : d.device.is_cpu() ? st.cpu_bytes : st.disk_bytes) += d.placed;
    }
    st.bytes = sizes.total();
    st.seconds = placed_stage_seconds(sub, sizes, st.plan.device_map, o, p, st.streamed);
    out.push_back(std::move(st));
  }
  // Ties across stages: each stage holding a name holds the tensor.
  const auto& tens = tree.tensors();
  for (const auto& g : units.tied()) {
    for (std::size_t k = 0; k < out.size(); ++k) {
      std::vector<std::string> here, elsewhere;
      std::vector<std::size_t> where;
      for (std::size_t i = 0; i < g.units.size(); ++i) {
        const auto s = stage_of_unit(g.units[i]);
        if (s == k) {
          here.push_back(tens[g.tensors[i]].name);
        } else {
          elsewhere.push_back(tens[g.tensors[i]].name);
          if (std::find(where.begin(), where.end(), s) == where.end()) where.push_back(s);
        }
      }
      if (here.empty() || elsewhere.empty()) continue;
      std::string stages;
      for (auto s : where) stages += (stages.empty() ? "" : ", ") + std::to_string(s);
      out[k].tied_copies.push_back(concat(text::quoted_list(here), " (tied to ", text::quoted_list(elsewhere),
                                          where.size() == 1 ? " in stage " : " in stages ", stages, ")"));
    }
  }
  return out;
}

inline StageSplit judge_split(std::vector<std::size_t> bounds, const std::vector<PipelineStage>& stages) {
  StageSplit s;
  s.bounds = std::move(bounds);
  for (const auto& st : stages) s.seconds.push_back(st.seconds);
  s.imbalance = imbalance_of(s.seconds);
  return s;
}

}  // namespace detail

/// @brief Splits the model into `pipeline.stages` contiguous stages balanced for the slowest
///        stage's estimated time, and places each on its own process's devices.
///
/// Units (no-split blocks, modules without children, loose tensors of split modules) are cut into
/// S runs in execution order (the tree's model order) minimising the slowest stage's estimated
/// seconds under each stage's budgets, with the most even split among those; then every stage is
/// planned alone (plan_device_map with `pipeline.mode` and `opts`, its process's budgets) and timed
/// on its map: GPU-resident bytes / gpu_read, what streams at opts.bandwidths (streaming_cost),
/// row-read input embeddings free. The split balancing parameter counts is planned and timed the
/// same way (PipelinePlan::by_parameters); if it is faster once placed, it is the plan's.
/// @param sizes compute_module_sizes(tree, size_options(opts))
/// @param opts the planner's options (no-split rules, dtype, objective, bandwidths, reserve layers);
///        its max_memory are every stage's budgets unless pipeline.stage_budgets gives them
/// @return the stages, their maps and times, the imbalance and the baseline's
/// @throws accel::usage_error for fewer than 1 stage, more stages than units, stage_budgets
///         neither empty nor one per stage, or a read or streaming rate (gpu_read, cpu_read,
///         opts.bandwidths) not positive and finite; accel::planning_error when no split fits the budgets
///         (naming a unit no process holds on its own, else a stage, what it needs, what its process
///         holds and keeps free for its largest unit) or a stage fits none of its process's devices
///         (naming it)
/// @note pure: the same inputs give the same plan on every rank, with no communication
/// @code
/// accel::PlanOptions opts;
/// opts.max_memory = accel::parse_max_memory("0=40GiB,cpu=100GiB");  // each stage's process
/// auto pipe = accel::plan_pipeline(tree, opts, {.stages = 4});
/// for (const auto& st : pipe.stages) std::printf("%s: %.3f ms\n", pipe.units[st.first_unit].c_str(), st.seconds * 1e3);
/// @endcode
[[nodiscard]] inline PipelinePlan plan_pipeline(const ModuleTree& tree, const ModuleSizes& sizes, const PlanOptions& opts,
                                                const PipelineOptions& pipeline) {
  detail::require_sizes_of(tree, sizes);
  if (pipeline.stages < 1)
    detail::throw_error<usage_error>("plan_pipeline: ", pipeline.stages, " stages; ask for 1 or more");
  const auto S = static_cast<std::size_t>(pipeline.stages);
  if (!pipeline.stage_budgets.empty() && pipeline.stage_budgets.size() != S)
    detail::throw_error<usage_error>("plan_pipeline: ", pipeline.stage_budgets.size(), " stage budgets for ", S,
                                     " stages; give one per stage, or none to use max_memory for every stage");
  // A rate of 0, below 0 or not finite would make every stage's time NaN or infinite, which the
  // search would report as budgets no split fits.
  for (const auto& [name, rate] : {std::pair{"PipelineOptions::gpu_read", pipeline.gpu_read},
                                   std::pair{"PipelineOptions::cpu_read", pipeline.cpu_read},
                                   std::pair{"PlanOptions::bandwidths.host_to_device", opts.bandwidths.host_to_device},
                                   std::pair{"PlanOptions::bandwidths.disk_read", opts.bandwidths.disk_read}})
    if (!std::isfinite(rate) || rate <= 0)
      detail::throw_error<usage_error>("plan_pipeline: ", name, " is ", rate, " bytes/s; give a positive, finite rate (bytes/s)");
  const std::vector<MaxMemory> budgets = pipeline.stage_budgets.empty() ? std::vector<MaxMemory>(S, opts.max_memory)
                                                                        : pipeline.stage_budgets;
  const detail::StageUnits units(tree, sizes, opts);
  if (S > units.size())
    detail::throw_error<usage_error>("plan_pipeline: ", S, " stages, but the model has only ",
                                     text::plural(static_cast<long long>(units.size()), "unit"),
                                     " a stage boundary may fall between (no-split blocks, modules without children, "
                                     "tensors of split modules); ask for ", units.size(), " stages or fewer");
  std::vector<detail::StageCapacity> capacity;
  for (const auto& b : budgets) capacity.push_back(detail::stage_capacity(b, opts.budget_scale));
  const auto estimate = [&](std::size_t k, std::size_t i, std::size_t j) {
    return detail::estimate_stage_seconds(units.load(i, j), capacity[k], opts.bandwidths, pipeline.gpu_read, pipeline.cpu_read,
                                          opts.gpu_reserve_layers);
  };
  const auto by_params = detail::split_stages(units.size(), S, [&](std::size_t, std::size_t i, std::size_t j) {
    return static_cast<double>(units.params(i, j));
  });
  const auto by_time = detail::split_stages(units.size(), S, estimate);
  if (by_time.empty()) {
    // A unit no stage's process holds on its own: more stages cannot help.
    for (std::size_t u = 0; u < units.size(); ++u) {
      bool anywhere = false;
      for (std::size_t k = 0; k < S && !anywhere; ++k) anywhere = estimate(k, u, u + 1) < std::numeric_limits<double>::infinity();
      if (anywhere) continue;
      detail::throw_error<planning_error>("no split into ", S, " stages fits the budgets: unit ", units.units()[u].name, " (",
                                          text::format_bytes(units.load(u, u + 1).bytes), ") fits no stage's process on its own: ",
                                          detail::describe_fit(units, u, u + 1, capacity[0], budgets[0], opts.gpu_reserve_layers),
                                          "; raise the budgets (more stages cannot help)");
    }
    // Every split has a stage its process cannot hold: name one (the parameter split's first).
    for (std::size_t k = 0; k < S; ++k) {
      const auto i = by_params[k], j = by_params[k + 1];
      if (estimate(k, i, j) < std::numeric_limits<double>::infinity()) continue;
      detail::throw_error<planning_error>(
          "no split into ", S, " stages fits the budgets: split by parameter count, stage ", k, " (",
          detail::describe_units(units, i, j), ") ", detail::describe_fit(units, i, j, capacity[k], budgets[k], opts.gpu_reserve_layers),
          "; the whole model is ", text::format_bytes(units.load(0, units.size()).bytes),
          ": raise the budgets (a disk budget, more cpu) or use more stages");
    }
  }

  PipelinePlan out;
  for (const auto& u : units.units()) out.units.push_back(u.name);
  out.bandwidths = opts.bandwidths;
  out.gpu_read = pipeline.gpu_read;
  out.cpu_read = pipeline.cpu_read;
  // Both splits placed; the faster once placed is kept (the estimate cannot see every packing detail).
  std::vector<PipelineStage> param_stages;
  try {
    param_stages = detail::place_stages(tree, units, by_params, budgets, opts, pipeline);
    out.by_parameters = detail::judge_split(by_params, param_stages);
  } catch (const planning_error& e) {
    out.by_parameters.bounds = by_params;
    out.by_parameters.problem = detail::message_body(e);
  }
  std::vector<PipelineStage> time_stages;
  try {
    time_stages = detail::place_stages(tree, units, by_time, budgets, opts, pipeline);
  } catch (const planning_error&) {
    if (!out.by_parameters.problem.empty()) throw;
  }
  const auto slowest = [](const std::vector<PipelineStage>& st) {
    double s = 0;
    for (const auto& x : st) s = std::max(s, x.seconds);
    return s;
  };
  if (time_stages.empty() || (!param_stages.empty() && slowest(param_stages) < slowest(time_stages) * (1 - 1e-12))) {
    out.stages = std::move(param_stages);
    out.parameter_split_kept = true;
  } else {
    out.stages = std::move(time_stages);
  }
  std::vector<double> seconds;
  for (const auto& st : out.stages) seconds.push_back(st.seconds);
  out.imbalance = detail::imbalance_of(seconds);
  return out;
}

/// @brief plan_pipeline computing the module sizes itself (see the overload above).
[[nodiscard]] inline PipelinePlan plan_pipeline(const ModuleTree& tree, const PlanOptions& opts, const PipelineOptions& pipeline) {
  return plan_pipeline(tree, compute_module_sizes(tree, size_options(opts)), opts, pipeline);
}

ACCEL_NAMESPACE_END
