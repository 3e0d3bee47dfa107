// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file auto_dispatch.hpp
/// @brief The one-call form, as transformers' `from_pretrained(path, device_map="auto", ...)`:
///        plan a device map for a checkpoint with a strategy ("auto", "balanced",
///        "balanced_low_0", "sequential") and budgets, then load it
///        (`load_checkpoint_and_dispatch(path, AutoDispatchOptions)`); given a DistributedState,
///        on that process's own group of GPUs only (`load_checkpoint_and_dispatch(path, state, options)`).
///
/// The plan is made exactly as `accel plan --checkpoint PATH` makes it: the model as transformers
/// builds it from the headers, config.json and the architecture catalog (construction order,
/// no-split classes, ties, computed buffers), transformers' placement rules, the config's dtype
/// when none is given; the load is then the explicit-map form with that map.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/distributed_state.hpp>
#include <accel/runtime/error.hpp>
#include <accel/runtime/text.hpp>
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/names.hpp>
#include <accel/plan/map_names.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/pipeline_plan.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/plan/planner.hpp>
#include <accel/load/device_memory.hpp>
#include <accel/load/dispatch.hpp>
#include <accel/load/dispatched_model.hpp>
#include <accel/load/load_plan.hpp>
#include <accel/load/pipeline_load.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Options of the one-call load: how to plan the device map, and how to load.
struct AutoDispatchOptions {
  /// What the map is planned for: fit (transformers' map) or speed (the fewest weight bytes
  /// streamed per forward pass within the same budgets; see <accel/plan/objective.hpp>).
  PlanObjective objective = PlanObjective::fit;
  /// "auto", "balanced", "balanced_low_0" or "sequential" (accelerate's strategies).
  std::string device_map = "auto";
  /// Budgets per GPU, cpu and disk (parse_max_memory("0=20GiB,cpu=64GiB") or set directly). Unset:
  /// measured as `accel plan` measures them: each GPU of `load.devices` its free memory less
  /// max(1 GiB, 10 % of its total), the cpu 90 % of the available RAM, disk unbounded.
  std::optional<MaxMemory> max_memory{};
  /// Blocks never split across devices: class names, module names or globs, each of which must
  /// match. Empty: the architecture catalog's no-split classes when config.json names a known
  /// architecture, else every numbered child (`layers.0`, `layers.1`, ...) is a block.
  std::vector<std::string> no_split{};
  /// The model's config.json when it does not sit next to the checkpoint.
  std::optional<std::filesystem::path> config_file{};
  /// A user's catalog (tests/compat/gen_user_catalog.py) for an architecture newer than accel's,
  /// searched first (see CheckpointTreeOptions::catalog_file).
  std::optional<std::filesystem::path> catalog_file{};
  /// Pipeline stages S (plan_pipeline_load): the model cut into S contiguous stages balanced for
  /// the slowest stage's time, each placed on its process's budgets (`max_memory`, the same for
  /// every stage's process). The state form of load_checkpoint_and_dispatch then loads only its
  /// process's stage: stage = rank % S (rank = replica * S + stage, as grid_groups numbers them).
  /// 1: the whole model.
  int stages = 1;
  /// How to load. `load.dtype` unset: with a config.json the config's dtype (transformers'
  /// `dtype="auto"`), without one every tensor keeps its stored dtype. `load.keep_in_fp32` gets the
  /// catalog's keep-in-fp32 modules for that dtype added. `load.devices` are the GPUs planned for
  /// (unset: every visible CUDA GPU).
  LoadOptions load{};
};

/// @brief A plan for the one-call load: the device map and the options the load runs with.
struct AutoDispatchPlan {
  PlanResult plan;          ///< the device map with its per-device accounting (as `accel plan` prints it)
  LoadOptions load;         ///< the load options with the dtype, keep-in-fp32 list, ties, devices and
                            ///< execution GPU with its fetch buffers (plan.execution) decided
  std::string architecture; ///< which catalog entry shaped the model, or why none did
};

/// @brief Budgets measured as `accel plan` measures them, from the GPUs a load will use and the
/// machine's available RAM (default_max_memory of their free memory). GPU key i is `devices[i]`,
/// as the map's GPU i is (LoadOptions::devices), whatever its logical index: measured over a
/// process's group, key 0 is the group's first GPU.
/// @throws unavailable_error when the RAM cannot be measured and there is no GPU
[[nodiscard]] inline MaxMemory measured_max_memory(const std::vector<DeviceMemoryPtr>& devices) {
  std::vector<DeviceBudgetInfo> gpus;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const auto info = devices[i]->memory_info();
    gpus.push_back({static_cast<int>(i), info.total_bytes, info.free_bytes});
  }
  const auto ram = read_available_ram();
  if (!ram && gpus.empty())
    detail::throw_error<unavailable_error>("cannot measure the available RAM and no GPU is visible; give the budgets "
                                           "(AutoDispatchOptions::max_memory, e.g. parse_max_memory(\"cpu=64GiB\"), or "
                                           "accel load --max-memory cpu=64GiB)");
  return default_max_memory(gpus, ram.value_or(0));
}

namespace detail {
// `cuda:2,cuda:3 (physical GPUs 6,7)`: a process's group, for messages.
inline std::string describe_group(const DistributedState& state) {
  std::string gpus, physical;
  for (const auto& d : state.devices()) gpus += (gpus.empty() ? "" : ",") + d.to_string();
  for (const auto& p : state.physical_gpus()) physical += (physical.empty() ? "" : ",") + p;
  if (state.physical_gpus().empty()) return gpus;
  return concat(gpus, state.physical_gpus().size() == 1 ? " (physical GPU " : " (physical GPUs ", physical, ")");
}
}  // namespace detail

/// @brief The GPUs a process owns (DistributedState::devices(), its group), in the group's order,
///        picked from the machine's visible GPUs: `visible[i]` is logical GPU i (LoadOptions::devices'
///        rule), so the group's j-th GPU is `visible[state.devices()[j].index()]`. Empty when the
///        process runs on the CPU. Pure function: nothing is allocated or queried.
/// @param visible every GPU the process sees (cuda_device_memories(), or host-simulated ones)
/// @throws unavailable_error when the group names a GPU that `visible` lacks
[[nodiscard]] inline std::vector<DeviceMemoryPtr> group_device_memories(const DistributedState& state,
                                                                         const std::vector<DeviceMemoryPtr>& visible) {
  std::vector<DeviceMemoryPtr> group;
  for (const Device& d : state.devices()) {
    if (!d.is_cuda()) continue;
    if (d.index() < 0 || static_cast<std::size_t>(d.index()) >= visible.size())
      detail::throw_error<unavailable_error>(
          "process ", state.process_index(), "'s group is ", detail::describe_group(state), " but ",
          visible.empty() ? std::string("no GPU is given")
                          : detail::concat("only ", text::plural(static_cast<long long>(visible.size()), "GPU"), " (cuda:0-",
                                           visible.size() - 1, ") are given"),
          " to load on; give every GPU the process sees (LoadOptions::devices unset: every visible CUDA GPU)");
    group.push_back(visible[static_cast<std::size_t>(d.index())]);
  }
  return group;
}

namespace detail {

// Every GPU a budget names must be one of the devices the load places on.
inline void require_budgeted_gpus(const MaxMemory& budgets, const std::vector<DeviceMemoryPtr>& devices) {
  for (const auto& [gpu, bytes] : budgets.gpus)
    if (gpu < 0 || static_cast<std::size_t>(gpu) >= devices.size())
      throw_error<unavailable_error>(
          "max_memory gives GPU ", gpu, " a budget (", text::format_bytes(bytes), ") but ",
          devices.empty()       ? std::string("no GPU is visible")
          : devices.size() == 1 ? std::string("only GPU 0 is visible")
                                : concat("only ", devices.size(), " GPUs (0-", devices.size() - 1, ") are visible"),
          "; budget only GPUs that exist, or use cpu/disk");
}

// Names the tree ties to a tensor the checkpoint holds, which the checkpoint itself lacks
// (a tied LM head): {alias, source} for LoadOptions::tied, the source in the checkpoint's name
// (`names`: the tree's name of every checkpoint tensor, so also what the checkpoint holds).
// The checkpoint name of every tensor the checkpoint holds, by its tree name.
inline std::unordered_map<std::string_view, std::string_view> checkpoint_names_by_model(const NameTable& names) {
  std::unordered_map<std::string_view, std::string_view> stored;
  for (std::size_t i = 0; i < names.model.size(); ++i) stored.emplace(names.model[i], names.checkpoint[i]);
  return stored;
}

inline std::vector<std::pair<std::string, std::string>> tied_aliases(const ModuleTree& tree, const NameTable& names) {
  const auto stored = checkpoint_names_by_model(names);
  auto checkpoint_name = [&](const std::string& n) -> const std::string_view* {
    auto it = stored.find(n);
    return it != stored.end() ? &it->second : nullptr;
  };
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& group : index_tree(tree).tied_groups) {
    const std::string_view* source = nullptr;
    for (auto id : group)
      if ((source = checkpoint_name(tree.tensors()[id].name))) break;
    if (!source) continue;
    for (auto id : group)
      if (const auto& name = tree.tensors()[id].name; !checkpoint_name(name)) out.emplace_back(name, std::string(*source));
  }
  return out;
}

// The checkpoint names of the row-read input embeddings (row_read_embeddings) the map puts off
// the GPUs: the speed objective plans no fetch-buffer reserve for them (LoadOptions::row_read_tensors).
inline std::vector<std::string> row_read_offloaded(const ModuleTree& tree, const NameTable& names, const DeviceMap& map) {
  const auto row_read = row_read_embeddings(tree);
  const auto stored = checkpoint_names_by_model(names);
  std::vector<std::string> out;
  for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
    if (!row_read[t]) continue;
    const auto& name = tree.tensors()[t].name;
    const auto where = map.placement_of(name);
    if (const auto it = stored.find(name); it != stored.end() && where && !where->is_gpu()) out.emplace_back(it->second);
  }
  return out;
}

}  // namespace detail

/// @brief The planner options a load plans with (before the model's no-split blocks): `accel plan`'s
///        transformers rules, `budgets`, the load's dtype and keep-in-fp32 patterns, room on the
///        first GPU for every fetch buffer, and a map no GPU can fetch its offloaded layers into
///        refused (PlanOptions::require_fetch_room). `accel load` and plan_auto_dispatch both start here.
/// @param devices the GPUs the load places on (LoadOptions::devices)
/// @throws unavailable_error when a budget names a GPU that is not among `devices`
[[nodiscard]] inline PlanOptions load_plan_options(MaxMemory budgets, const std::vector<DeviceMemoryPtr>& devices,
                                                   const LoadOptions& load) {
  detail::require_budgeted_gpus(budgets, devices);
  PlanOptions plan;
  plan.max_memory = std::move(budgets);
  plan.rules = PlanRules::transformers;
  plan.dtype = load.dtype;
  plan.keep_in_fp32 = load.keep_in_fp32;
  plan.gpu_reserve_layers = static_cast<std::uint32_t>(std::max(load.fetch_slots, 1));  // room for every fetch buffer
  plan.require_fetch_room = true;  // refused before anything is allocated, not out of memory while loading
  return plan;
}

/// @brief The load options a planned map loads with: the plan's execution GPU and fetch buffers
///        (PlanResult::execution, so the load never re-derives them from the map) and, for the
///        speed objective, the row-read input embeddings the map puts off the GPUs, for which no
///        fetch buffer is sized (LoadOptions::row_read_tensors). `accel load` and
///        plan_auto_dispatch both end here.
/// @param tree the model the plan was made for
/// @param names the checkpoint's names of its tensors (CheckpointModel::names)
[[nodiscard]] inline LoadOptions planned_load_options(LoadOptions load, const ModuleTree& tree, const NameTable& names,
                                                      const PlanResult& plan) {
  load.execution = plan.execution;
  if (plan.objective == PlanObjective::speed) load.row_read_tensors = detail::row_read_offloaded(tree, names, plan.device_map);
  return load;
}

namespace detail {

// What planning a checkpoint's load starts from: the model as `accel plan` builds it, the planner's
// options (budgets, dtype, keep-in-fp32, no-split blocks) and the load options before the map.
struct LoadPlanning {
  CheckpointModel model;
  PlanOptions plan;
  DeviceMapMode mode = DeviceMapMode::automatic;
  bool defaulted = false;  // the budgets were measured
  LoadOptions load;
};

inline LoadPlanning load_planning(const Checkpoint& checkpoint, const AutoDispatchOptions& options) {
  LoadPlanning out;
  out.mode = parse_device_map_mode(options.device_map);
  out.load = options.load;
  out.load.devices = options.load.devices ? *options.load.devices : cuda_device_memories();
  const auto& devices = *out.load.devices;

  CheckpointTreeOptions tree_options;
  tree_options.config_file = options.config_file;
  tree_options.catalog_file = options.catalog_file;
  tree_options.load_dtype = options.load.dtype;
  out.model = model_from_checkpoint(checkpoint, tree_options);
  auto& model = out.model;

  out.defaulted = !options.max_memory;
  PlanOptions& plan = out.plan;
  plan = load_plan_options(out.defaulted ? measured_max_memory(devices) : *options.max_memory, devices, options.load);
  if (!plan.dtype && model.config) plan.dtype = model.auto_dtype;
  plan.budget_scale = model.budget_scale();
  plan.objective = options.objective;
  for (auto& k : model.keep_in_fp32(plan.dtype))
    if (std::find(plan.keep_in_fp32.begin(), plan.keep_in_fp32.end(), k) == plan.keep_in_fp32.end())
      plan.keep_in_fp32.push_back(std::move(k));
  if (!options.no_split.empty()) {
    check_no_split_specs(model.tree, options.no_split);
    plan.no_split = options.no_split;
    plan.auto_no_split = false;
  } else if (model.architecture) {
    plan.no_split = model.no_split_classes();
    plan.auto_no_split = false;
  }
  out.load.config_file = options.config_file;
  out.load.dtype = plan.dtype;
  out.load.keep_in_fp32 = plan.keep_in_fp32;
  return out;
}

// Hands the loader what the planner worked out: the names and the quantization (moved out of the
// model, which is done with them), and that the maps are in model names (the tree's).
inline void hand_naming_to_load(CheckpointModel& model, LoadOptions& load) {
  load.naming = std::make_shared<const CheckpointNaming>(CheckpointNaming{std::move(model.names), std::move(model.quantization), nullptr});
  load.map_names = MapNames::model;
}

}  // namespace detail

/// @brief Plans the one-call load of a resolved checkpoint without reading any weight: the model
///        from headers + config.json + catalog, the budgets, then the strategy's device map. The
///        returned load options carry the names and quantization the model was built with
///        (LoadOptions::naming), so loading this plan does not work them out again.
/// @throws accel::usage_error for an unknown strategy, a no-split spec matching nothing, or
///         `stages` other than 1 (see plan_pipeline_load); accel::unavailable_error for a budget
///         naming an absent GPU; accel::planning_error when the model fits nowhere, or when no GPU has room for a fetch buffer of the largest layer
///         the map offloads (naming the layer and each GPU's room); accel::checkpoint_error for an
///         unreadable config.json
[[nodiscard]] inline AutoDispatchPlan plan_auto_dispatch(const Checkpoint& checkpoint, const AutoDispatchOptions& options) {
  if (options.stages != 1)
    detail::throw_error<usage_error>("AutoDispatchOptions::stages is ", options.stages, ": a pipeline load plans every stage "
                                     "(plan_pipeline_load) and loads one (load_stage, or load_checkpoint_and_dispatch with "
                                     "a DistributedState, whose rank picks it); set stages = 1 for the whole model");
  auto setup = detail::load_planning(checkpoint, options);
  const auto& model = setup.model;
  AutoDispatchPlan out;
  out.architecture = model.architecture_note;
  out.plan = plan_device_map(model.tree, setup.mode, setup.plan, setup.defaulted);
  out.load = planned_load_options(std::move(setup.load), model.tree, model.names, out.plan);
  for (auto& tie : detail::tied_aliases(model.tree, model.names))
    if (std::none_of(out.load.tied.begin(), out.load.tied.end(), [&](const auto& t) { return t.first == tie.first; }))
      out.load.tied.push_back(std::move(tie));
  detail::hand_naming_to_load(setup.model, out.load);
  return out;
}

/// @brief Plans the one-call load of one process of a job on its own GPUs only: the group of
///        `state` (DistributedState::devices(); one GPU, or K with StateOptions::gpus_per_process).
///
/// The map's GPU i is the group's i-th GPU: `options.max_memory` keys index the group (`0` is
/// `state.devices()[0]`), unset budgets are measured on the group's GPUs only, and the map names
/// no GPU outside it. `options.load.devices`, when set, are every GPU the process sees (index i =
/// logical GPU i), from which the group is taken; the returned plan's `load.devices` are the group's.
/// On the CPU the group has no GPU: the map uses cpu and disk.
/// @throws accel::usage_error for a budget keyed past the group (naming its size and GPUs); as
///         plan_auto_dispatch(checkpoint, options) otherwise
[[nodiscard]] inline AutoDispatchPlan plan_auto_dispatch(const Checkpoint& checkpoint, const DistributedState& state,
                                                        AutoDispatchOptions options) {
  const std::size_t group_size = state.device().is_cuda() ? state.devices().size() : 0;  // {cpu}: no GPU
  if (options.max_memory) require_group_budgets(*options.max_memory, group_size, detail::describe_group(state));
  options.load.devices = group_device_memories(state, options.load.devices ? *options.load.devices : cuda_device_memories());
  return plan_auto_dispatch(checkpoint, options);
}

/// @brief Plans a device map for a checkpoint and loads it, in one call (see AutoDispatchOptions).
/// @param checkpoint a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding them
///        (config.json is looked for next to it)
/// @throws as plan_auto_dispatch, then as the explicit-map load_checkpoint_and_dispatch
/// @note blocking; LoadReport::seconds covers planning and loading
/// @code
/// auto model = accel::load_checkpoint_and_dispatch("ckpt/", accel::AutoDispatchOptions{
///     .device_map = "balanced", .max_memory = accel::parse_max_memory("0=20GiB,1=20GiB,cpu=64GiB"),
///     .load = {.dtype = accel::DType::BF16, .offload_folder = "offload/"}});
/// @endcode
[[nodiscard]] inline DispatchedModel load_checkpoint_and_dispatch(const std::filesystem::path& checkpoint,
                                                                 const AutoDispatchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Checkpoint resolved = resolve_checkpoint(checkpoint);
  auto planned = plan_auto_dispatch(resolved, options);
  return detail::plan_and_load(resolved, planned.plan.device_map, planned.load, start);
}

/// @brief Plans a checkpoint's pipeline stages and what loading each needs, without reading any
///        weight: the model and budgets as plan_auto_dispatch makes them, then plan_pipeline with
///        `options.stages` stages (every stage's process with `max_memory`, its GPU keys indexing
///        that process's group, the strategy `device_map`). The plan carries the names and the
///        quantization the model was built with (LoadOptions::naming), so load_stage works neither
///        out again. Pure given the budgets: every process computes the same plan.
/// @throws accel::usage_error for stages < 1 or more stages than the model has units, and as
///         plan_auto_dispatch; accel::planning_error when no split fits the budgets (naming a stage)
/// @code
/// auto ckpt = accel::resolve_checkpoint("ckpt/");
/// auto plan = accel::plan_pipeline_load(ckpt, {.max_memory = accel::parse_max_memory("0=40GiB,cpu=64GiB"), .stages = 4});
/// auto mine = accel::load_stage(ckpt, plan, 2);  // stage 2's tensors only
/// @endcode
[[nodiscard]] inline PipelineLoadPlan plan_pipeline_load(const Checkpoint& checkpoint, const AutoDispatchOptions& options) {
  auto setup = detail::load_planning(checkpoint, options);
  const auto& model = setup.model;
  PipelineOptions pipeline;
  pipeline.stages = options.stages;
  pipeline.mode = setup.mode;
  pipeline.budgets_defaulted = setup.defaulted;
  const auto sizes = compute_module_sizes(model.tree, size_options(setup.plan));
  PipelineLoadPlan out;
  out.architecture = model.architecture_note;
  out.pipeline = plan_pipeline(model.tree, sizes, setup.plan, pipeline);
  const auto stored = detail::checkpoint_names_by_model(model.names);
  for (const auto& st : out.pipeline.stages)
    out.stage_loads.push_back(detail::stage_load(model.tree, sizes, stored, st.plan.device_map,
                                                 setup.plan.objective == PlanObjective::speed));
  out.load = std::move(setup.load);
  detail::hand_naming_to_load(setup.model, out.load);
  return out;
}

namespace detail {
// A stage load's budgets must be given: measured ones differ from process to process, and every
// process must compute the same plan. The ranks must fill whole replicas of the stages.
inline void require_stage_job(const DistributedState& state, const AutoDispatchOptions& options) {
  if (options.stages < 1)
    throw_error<usage_error>("AutoDispatchOptions::stages is ", options.stages, "; ask for 1 or more");
  if (state.num_processes() % options.stages != 0)
    throw_error<usage_error>("AutoDispatchOptions::stages is ", options.stages, " but the job has ",
                             text::plural(state.num_processes(), "process"), ", not a whole number of replicas of the stages; start a "
                             "multiple of ", options.stages, " processes (rank = replica * stages + stage)");
  if (!options.max_memory)
    throw_error<usage_error>("a pipeline load (AutoDispatchOptions::stages = ", options.stages, ") needs the budgets of a "
                             "stage's process (AutoDispatchOptions::max_memory): measured ones differ between processes, and "
                             "every process must compute the same plan");
}
}  // namespace detail

/// @brief Plans the pipeline stages as process `state` computes them (see plan_pipeline_load): its
///        group of GPUs (DistributedState::devices()) is what `max_memory`'s GPU keys index, and the
///        plan's `load.devices`. Every process of the job computes the same stages.
/// @throws accel::usage_error when `max_memory` is unset, the job's process count is not a multiple
///         of `stages`, or a budget is keyed past the group; as plan_pipeline_load otherwise
[[nodiscard]] inline PipelineLoadPlan plan_pipeline_load(const Checkpoint& checkpoint, const DistributedState& state,
                                                         AutoDispatchOptions options) {
  detail::require_stage_job(state, options);
  const std::size_t group_size = state.device().is_cuda() ? state.devices().size() : 0;
  require_group_budgets(*options.max_memory, group_size, detail::describe_group(state));
  options.load.devices = group_device_memories(state, options.load.devices ? *options.load.devices : cuda_device_memories());
  return plan_pipeline_load(checkpoint, options);
}

/// @brief Loads one pipeline stage of a resolved checkpoint: only the tensors its map covers, plus
///        its own copy of each tensor tied to one in another stage (loaded from the checkpoint
///        tensor), onto the plan's devices (`plan.load.devices`, the map's GPU i being the i-th).
///        What it loads is PipelineStage::bytes less StageLoad::computed_bytes.
/// @param plan from plan_pipeline_load of this checkpoint
/// @param stage 0 to plan.stages() - 1
/// @throws accel::usage_error for a stage out of range or a plan made for another checkpoint; as
///         the explicit-map load_checkpoint_and_dispatch otherwise
/// @note blocking; the other stages' tensors are listed in LoadReport::unexpected (not loaded)
[[nodiscard]] inline DispatchedModel load_stage(const Checkpoint& checkpoint, const PipelineLoadPlan& plan, int stage) {
  const auto start = std::chrono::steady_clock::now();
  const LoadOptions options = plan.stage_options(stage);
  return detail::plan_and_load(checkpoint, plan.stage_map(stage), options, start);
}

/// @brief As above, resolving the checkpoint first (`path`: a file, an index or a folder).
[[nodiscard]] inline DispatchedModel load_stage(const std::filesystem::path& path, const PipelineLoadPlan& plan, int stage) {
  return load_stage(resolve_checkpoint(path), plan, stage);
}

/// @brief Plans and loads one process's copy of a model on its own group of GPUs, in one call (see
///        plan_auto_dispatch(checkpoint, state, options)): the map's GPU i is loaded onto
///        `state.devices()[i]`, and `DispatchedModel`'s placements and execution GPU index the group.
///        With `options.stages` S > 1 it loads only the process's pipeline stage, stage = rank % S
///        (plan_pipeline_load, then load_stage): every process computes the same plan, no message
///        is exchanged.
/// @throws as plan_auto_dispatch(checkpoint, state, options), then as the explicit-map load; with
///         stages: as plan_pipeline_load(checkpoint, state, options) and load_stage
/// @note blocking; every process of the job calls it for its own copy (or stage), independently
/// @code
/// accel::DistributedState state(accel::StateOptions{.gpus_per_process = 2});
/// auto model = accel::load_checkpoint_and_dispatch(
///     "ckpt/", state, {.max_memory = accel::parse_max_memory("0=70GiB,1=70GiB,cpu=200GiB")});  // 0, 1: the group's GPUs
/// @endcode
[[nodiscard]] inline DispatchedModel load_checkpoint_and_dispatch(const std::filesystem::path& checkpoint,
                                                                 const DistributedState& state,
                                                                 const AutoDispatchOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Checkpoint resolved = resolve_checkpoint(checkpoint);
  if (options.stages != 1) {
    const auto plan = plan_pipeline_load(resolved, state, options);
    const int stage = state.process_index() % options.stages;
    return detail::plan_and_load(resolved, plan.stage_map(stage), plan.stage_options(stage), start);
  }
  auto planned = plan_auto_dispatch(resolved, state, options);
  return detail::plan_and_load(resolved, planned.plan.device_map, planned.load, start);
}

ACCEL_NAMESPACE_END
