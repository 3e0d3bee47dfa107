// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file pipeline_load.hpp
/// @brief PipelineLoadPlan: a checkpoint's pipeline stages (plan_pipeline) with what loading each
///        needs (plan_pipeline_load and load_stage in auto_dispatch.hpp make and load it). Per stage:
///        its ties (an alias of a tensor it loads, or its own copy of a tensor another stage loads),
///        the row-read embeddings it leaves off its GPUs, and the bytes of its computed buffers.
#pragma once

#include <cstdint>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/names.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/pipeline_plan.hpp>
#include <accel/runtime/error.hpp>
#include <accel/load/load_plan.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief What loading one stage adds to the load options every stage shares.
struct StageLoad {
  /// {alias, source}: names the stage holds that resolve to a tensor it loads (LoadOptions::tied).
  std::vector<std::pair<std::string, std::string>> tied{};
  /// {name, source}: the stage's own copy of a tensor tied to one another stage holds, loaded from
  /// the checkpoint tensor `source` (LoadOptions::tied_copies).
  std::vector<std::pair<std::string, std::string>> tied_copies{};
  /// Row-read input embeddings the stage's map puts off its GPUs (LoadOptions::row_read_tensors;
  /// speed objective only).
  std::vector<std::string> row_read_tensors{};
  /// Bytes counted in PipelineStage::bytes that no checkpoint tensor fills: buffers the model
  /// computes (rotary frequencies). What the stage loads is PipelineStage::bytes less these.
  std::uint64_t computed_bytes = 0;
};

/// @brief A checkpoint's pipeline stages and what loading each needs; every process of the job
///        computes the same one (plan_pipeline_load), then loads its own stage (load_stage).
struct PipelineLoadPlan {
  PipelinePlan pipeline{};                ///< the stages: units, maps (model names), bytes, times
  std::vector<StageLoad> stage_loads{};   ///< per stage, what its load adds to `load`
  LoadOptions load{};                     ///< every stage's: dtype, keep-in-fp32, names and quantization
                                          ///< (LoadOptions::naming), the process's GPUs
  std::string architecture{};             ///< which catalog entry shaped the model, or why none did

  /// @brief S, the number of stages.
  [[nodiscard]] int stages() const noexcept { return static_cast<int>(pipeline.stages.size()); }
  /// @brief The load options of stage `stage`: `load` with its execution GPU and fetch buffers
  ///        (PipelineStage::plan.execution), ties, copies and row-read embeddings. LoadOptions::strict
  ///        is off: a stage leaves the other stages' tensors unloaded by design (LoadReport::unexpected).
  /// @throws accel::usage_error when `stage` is not in [0, stages())
  [[nodiscard]] LoadOptions stage_options(int stage) const {
    require_stage(stage);
    const auto k = static_cast<std::size_t>(stage);
    LoadOptions o = load;
    o.execution = pipeline.stages[k].plan.execution;
    o.tied = stage_loads[k].tied;
    o.tied_copies = stage_loads[k].tied_copies;
    o.row_read_tensors = stage_loads[k].row_read_tensors;
    o.strict = false;
    return o;
  }
  /// @brief Stage `stage`'s device map (model names; GPU keys index its process's group).
  /// @throws accel::usage_error when `stage` is not in [0, stages())
  [[nodiscard]] const DeviceMap& stage_map(int stage) const {
    require_stage(stage);
    return pipeline.stages[static_cast<std::size_t>(stage)].plan.device_map;
  }

 private:
  void require_stage(int stage) const {
    if (stage < 0 || stage >= stages() || static_cast<std::size_t>(stage) >= stage_loads.size())
      detail::throw_error<usage_error>("stage ", stage, " of a plan with ", text::plural(stages(), "stage"),
                                       "; a stage is 0 to ", stages() - 1, " (rank % stages)");
  }
};

namespace detail {

// `stored`: the checkpoint name of every tensor the checkpoint holds, by its model name.
inline StageLoad stage_load(const ModuleTree& tree, const ModuleSizes& sizes,
                            const std::unordered_map<std::string_view, std::string_view>& stored, const DeviceMap& map,
                            bool speed) {
  StageLoad out;
  const auto& tens = tree.tensors();
  const auto index = tree.index();
  auto in_stage = [&](std::size_t t) { return map.placement_of(tens[t].name).has_value(); };
  auto stored_name = [&](std::size_t t) -> const std::string_view* {
    const auto it = stored.find(tens[t].name);
    return it != stored.end() ? &it->second : nullptr;
  };
  std::vector<bool> tied_to_stored(tens.size(), false);
  for (const auto& group : index->tied_groups) {
    const std::string_view* source = nullptr;
    std::size_t source_id = npos_id;
    for (auto t : group)
      if ((source = stored_name(t))) {
        source_id = t;
        break;
      }
    if (!source) continue;
    for (auto t : group) tied_to_stored[t] = true;
    // The names of the group this stage holds that the checkpoint lacks: aliases of the source
    // when the stage loads it, else the first is the stage's copy and the others its aliases.
    std::string target = in_stage(source_id) ? std::string(*source) : std::string();
    for (auto t : group) {
      if (!in_stage(t) || stored_name(t)) continue;
      if (target.empty()) {
        out.tied_copies.emplace_back(tens[t].name, std::string(*source));
        target = tens[t].name;
      } else {
        out.tied.emplace_back(tens[t].name, target);
      }
    }
  }
  for (std::size_t t = 0; t < tens.size(); ++t)
    if (!tied_to_stored[t] && !stored_name(t) && in_stage(t)) out.computed_bytes += sizes.tensor[t];
  if (speed) {
    const auto row_read = row_read_embeddings(tree);
    for (std::size_t t = 0; t < tens.size(); ++t) {
      if (!row_read[t]) continue;
      const auto where = map.placement_of(tens[t].name);
      if (const auto* name = stored_name(t); name && where && !where->is_gpu()) out.row_read_tensors.emplace_back(*name);
    }
  }
  return out;
}

}  // namespace detail

ACCEL_NAMESPACE_END
