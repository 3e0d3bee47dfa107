// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan` (device map as a table, JSON or SVG) and `accel estimate-memory` (sizes per dtype),
// both from checkpoint headers or a model skeleton: weights are never read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/runtime/devices.hpp>
#include <accel/plan/map_names.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/skeleton.hpp>
#include <accel/plan/objective.hpp>
#include <accel/plan/plan_report.hpp>
#include <accel/plan/planner.hpp>

#include "args.hpp"
#include "bandwidth.hpp"
#include "gpu_group.hpp"
#include "model_args.hpp"
#include "plan_stages.hpp"
#include "plan_svg.hpp"

namespace accel_cli {

inline constexpr OptionSpec plan_options[] = {
    {"checkpoint", OptionKind::text, "PATH", "safetensors file, model.safetensors.index.json or folder (headers only)"},
    {"skeleton", OptionKind::text, "FILE", "model skeleton JSON (modules/parameters/buffers/tied)"},
    {"list-architectures", OptionKind::flag, "", "list every architecture class the catalog (and --catalog FILE) plans "
                                                 "exactly, with the transformers version it was generated from, and exit"},
    {"max-memory", OptionKind::text, "BUDGETS", "'0=20GiB,1=20GiB,cpu=64GiB[,disk=0]' or a JSON object; default: measured"},
    {"device-map", OptionKind::text, "MODE", "auto (default), balanced, balanced_low_0 or sequential"},
    {"config", OptionKind::text, "FILE", "the model's config.json when it is not next to the checkpoint"},
    {"catalog", OptionKind::text, "FILE", "a catalog of architectures newer than accel's (tests/compat/gen_user_catalog.py "
                                          "writes one from your transformers), searched first; default: $ACCEL_CATALOG"},
    {"no-catalog", OptionKind::flag, "", "plan from headers and name heuristics only, as for an architecture no catalog knows"},
    {"no-split", OptionKind::text, "CLASS_OR_GLOB", "never split these modules (class name, module name or glob like "
                                                    "'model.layers.*'; 'none': no blocks); default: the catalog's classes", true},
    {"dtype", OptionKind::text, "DTYPE", "dtype floating tensors are loaded in (float16, bfloat16, float32, auto = the "
                                         "config's; default auto with a config.json, else as stored)"},
    {"keep-in-fp32", OptionKind::text, "PATTERN", "tensors loaded as float32 (matched as transformers does)", true},
    {"like", OptionKind::text, "WHO", "transformers (default: from_pretrained's map) or accelerate (infer_auto_device_map "
                                      "as called with these arguments: its dtype rule, no automatic blocks)"},
    {"offload-buffers", OptionKind::flag, "", "offload the buffers of offloaded modules too"},
    {"fallback", OptionKind::flag, "", "fill an otherwise empty main device with a smaller module"},
    {"gpu-reserve-layers", OptionKind::text, "N", "room kept on the first GPU for N largest layers (default 1, as accelerate; "
                                                  "accel load plans with 2 for its double-buffered fetch)"},
    {"no-clean", OptionKind::flag, "", "keep every placed entry (do not merge keys)"},
    {"json", OptionKind::flag, "", "print only the device map JSON on stdout"},
    {"names", OptionKind::text, "KIND", "names the map is written in: model (default; transformers 5's, what from_pretrained "
                                        "takes) or checkpoint (the files', what accelerate's load_checkpoint_and_dispatch reads)"},
    {"svg", OptionKind::text, "FILE", "also draw the plan as an SVG (one bar per device)"},
    {"verbose", OptionKind::flag, "", "trace every placement decision on stderr"},
    {"h2d-bandwidth", OptionKind::text, "RATE", "host-to-GPU bytes/s for the estimate (default 25GB)"},
    {"disk-bandwidth", OptionKind::text, "RATE", "disk read bytes/s for the estimate (default 2GB)"},
    {"objective", OptionKind::text, "WHAT", "fit (default: transformers' map) or speed (the fewest weight bytes streamed "
                                            "per forward pass within the same budgets; never more than fit)"},
    {"bandwidth", OptionKind::text, "RATES", "'cpu=25GB/s,disk=3GB/s' (GB/s, GiB/s, MB/s, MiB/s) for the estimates; "
                                             "default: accel env --measure-bandwidth's cache, else cpu=25GB/s,disk=2GB/s"},
    {"json-report", OptionKind::flag, "", "print the map with both objectives' bytes and time per forward pass, the "
                                          "moves and the rates as one JSON object"},
    gpus_per_process_option,
    process_option,
    {"simulate-gpus", OptionKind::text, "SIZES", "plan on host-simulated GPUs of these sizes ('80GiB,80GiB') instead of "
                                                 "this machine's: measured budgets and --process's group come from them"},
    stages_option,
    replicas_option,
};

inline constexpr const char* plan_usage = R"(usage: accel plan (--checkpoint PATH | --skeleton FILE) [options]

Plans which module goes to which GPU, to CPU or to disk (accelerate's infer_auto_device_map) from
headers only, and prints per device the bytes placed, % of budget and modules, then what must stream
to the GPU on every forward pass. Budgets default to each GPU's free memory minus max(1 GiB, 10% of
its total) and 90% of available RAM; disk is unbounded unless --max-memory gives disk=SIZE (disk=0
forbids it).

With --gpus_per_process K [--process R] it plans as local process R of a job with K GPUs per
process (accel launch --gpus_per_process K) would: on its group only, the visible GPUs R*K to
R*K+K-1, whose budgets are measured (or given with --max-memory, GPU key 0 being the group's first),
and the map's GPU keys 0 to K-1 index the group; the report names the group's physical GPUs.

With --stages S [--replicas R] it cuts the model into S pipeline stages, one per process of a
replica (rank = replica*S + stage), balanced for the slowest stage's estimated time, and places
each on its process's GPUs (K per process, default 1), CPU and disk share; --max-memory then gives
one process's budgets. The report gives per stage its units, bytes, estimated time and ranks, and
the imbalance beside the split balanced by parameter count; --json prints it as JSON.
Exit status: 0; 2 bad arguments; 3 bad budgets/skeleton; 5 infeasible; 6 bad checkpoint.)";

inline constexpr OptionSpec estimate_options[] = {
    {"checkpoint", OptionKind::text, "PATH", "safetensors file, index or folder (headers only)"},
    {"config", OptionKind::text, "FILE", "the model's config.json when it is not next to the checkpoint"},
    {"catalog", OptionKind::text, "FILE", "a catalog of architectures newer than accel's (tests/compat/gen_user_catalog.py "
                                          "writes one from your transformers), searched first; default: $ACCEL_CATALOG"},
    {"no-catalog", OptionKind::flag, "", "plan from headers and name heuristics only, as for an architecture no catalog knows"},
    {"skeleton", OptionKind::text, "FILE", "model skeleton JSON"},
    {"no-split", OptionKind::text, "CLASS_OR_GLOB", "blocks for the largest-layer column (default: the catalog's classes, "
                                                    "else numbered children; 'none': no blocks)", true},
    {"dtypes", OptionKind::text, "LIST", "rows to print (default float32,float16,int8,int4)"},
    {"json", OptionKind::flag, "", "print JSON instead of the table"},
};

inline constexpr const char* estimate_usage = R"(usage: accel estimate-memory (--checkpoint PATH | --skeleton FILE) [options]

Total size and largest layer per dtype, as `accelerate estimate-memory` prints them: floating
tensors counted at each row's width, integer and bool tensors, the buffers the model computes
(rotary inv_freq, position ids) and a quantized checkpoint's quantized weights and scales at their
own; shared tensors once. With a config.json the model is
built as transformers builds it (ties, computed buffers, no-split classes from the catalog).)";

inline double parse_rate(const std::optional<std::string>& v, double fallback, const char* option) {
  if (!v) return fallback;
  const auto bytes = accel::parse_byte_size(*v);
  if (bytes == 0) throw accel::usage_error("plan: --" + std::string(option) + " must be positive (got '" + *v + "')");
  return static_cast<double>(bytes);
}

// The rates for the estimates, and where they came from: --bandwidth, the older per-rate options,
// accel env --measure-bandwidth's cache, or the defaults.
inline std::pair<accel::Bandwidths, std::string> choose_bandwidths(const ParsedArgs& a) {
  accel::Bandwidths bw;
  if (a.has("bandwidth")) {
    if (a.has("h2d-bandwidth") || a.has("disk-bandwidth"))
      throw accel::usage_error("plan: give the rates with --bandwidth or with --h2d-bandwidth/--disk-bandwidth, not both");
    return {accel::parse_bandwidths(*a.value("bandwidth")), "rates from --bandwidth"};
  }
  if (a.has("h2d-bandwidth") || a.has("disk-bandwidth")) {
    bw.host_to_device = parse_rate(a.value("h2d-bandwidth"), bw.host_to_device, "h2d-bandwidth");
    bw.disk_read = parse_rate(a.value("disk-bandwidth"), bw.disk_read, "disk-bandwidth");
    return {bw, "rates given"};
  }
  const auto cache = bandwidth_cache_path(accel::process_env());
  std::error_code ec;
  if (cache && std::filesystem::is_regular_file(*cache, ec)) {
    try {
      return {parse_bandwidth_cache(accel::read_text_file(*cache, "bandwidth cache"), cache->string()).rates,
              "rates measured, from " + cache->string()};
    } catch (const accel::error& e) {
      return {bw, std::string("default rates; cache ignored: ") + e.what()};
    }
  }
  return {bw, "default rates; measure with accel env --measure-bandwidth"};
}

inline nlohmann::ordered_json cost_json(const accel::StreamingCost& c) {
  return {{"bytes", c.streamed()}, {"from_cpu", c.from_cpu}, {"from_disk", c.from_disk}, {"row_read_bytes", c.row_read},
          {"seconds", c.seconds}};
}

// --json-report: the map with everything the text report says about streaming.
inline nlohmann::ordered_json plan_report_json(const accel::PlanResult& plan, const accel::DeviceMap& written,
                                               const accel::ObjectiveComparison& c, const std::string& rates_note) {
  nlohmann::ordered_json j;
  j["objective"] = std::string(accel::plan_objective_name(plan.objective));
  j["device_map"] = written.to_json();
  j["streamed_per_forward_pass"] = {{"fit", cost_json(c.fit)}, {"speed", cost_json(c.speed)}};
  j["speed_map_differs"] = c.speed_map_differs;
  j["row_read"] = c.row_read;
  nlohmann::ordered_json moves = nlohmann::ordered_json::array();
  for (const auto& m : c.moves) moves.push_back({{"module", m.module}, {"from", m.from.to_json()}, {"to", m.to.to_json()}, {"why", m.why}});
  j["moves"] = std::move(moves);
  j["bandwidths"] = {{"host_to_device", c.bandwidths.host_to_device}, {"disk_read", c.bandwidths.disk_read}, {"source", rates_note}};
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (const auto& d : plan.devices) {
    nlohmann::ordered_json e = {{"device", d.device.to_json()}, {"placed", d.placed}, {"reserve", d.main ? d.reserve : 0}};
    e["budget"] = d.budget ? nlohmann::ordered_json(*d.budget) : nlohmann::ordered_json(nullptr);
    devices.push_back(std::move(e));
  }
  j["devices"] = std::move(devices);
  j["total_bytes"] = plan.total_bytes;
  const auto& e = plan.execution;  // where offloaded layers run, and the fetch buffers kept room for there
  j["execution"] = {{"gpu", e.gpu ? nlohmann::ordered_json(*e.gpu) : nlohmann::ordered_json(nullptr)},
                    {"fetch_buffers", e.fetch_slots}, {"fetch_buffer_bytes", e.fetch_buffer_bytes},
                    {"largest_offloaded_layer", e.largest_offloaded_layer}, {"loadable", e.loadable()}};
  return j;
}

// The GPUs plan measures and picks a group from: --simulate-gpus' (all free), else this machine's
// (`with_free`: with their free memory, which creates a CUDA context on each).
inline std::vector<accel::DeviceBudgetInfo> plan_gpus(const ParsedArgs& a, bool with_free) {
  std::vector<accel::DeviceBudgetInfo> gpus;
  if (auto sizes = a.value("simulate-gpus")) {
    for (const auto bytes : parse_simulated_sizes(*sizes, "plan")) gpus.push_back({static_cast<int>(gpus.size()), bytes, bytes});
    return gpus;
  }
  for (const auto& g : accel::default_device_query().list(with_free).gpus) gpus.push_back({g.index, g.total_memory, g.free_memory});
  return gpus;
}

// Only `group`'s GPUs, keyed by their place in it (0 = its first), as the map's keys index it.
inline std::vector<accel::DeviceBudgetInfo> group_gpus(const std::vector<accel::DeviceBudgetInfo>& gpus, const GpuGroup& group) {
  std::vector<accel::DeviceBudgetInfo> out;
  for (const auto& d : group.devices) {
    out.push_back(gpus.at(static_cast<std::size_t>(d.index())));
    out.back().index = static_cast<int>(out.size() - 1);
  }
  return out;
}

// The available RAM the measured budgets share (0 when unreadable but GPUs are visible).
inline std::uint64_t measured_ram(const std::vector<accel::DeviceBudgetInfo>& gpus) {
  const auto ram = accel::read_available_ram();
  if (!ram && gpus.empty())
    throw accel::unavailable_error("cannot measure available RAM and no GPU is visible; pass --max-memory");
  return ram.value_or(0);
}

inline accel::MaxMemory measured_budgets(const std::vector<accel::DeviceBudgetInfo>& gpus) {
  return accel::default_max_memory(gpus, measured_ram(gpus));
}

// `accel plan --list-architectures [--json]`: every class the embedded catalog, and a user's
// (--catalog FILE, else $ACCEL_CATALOG), plans exactly, and what the embedded one skipped.
inline int list_architectures(const ParsedArgs& a) {
  const auto& embedded = accel::architecture_catalog();
  std::optional<accel::ArchitectureCatalog> user;
  std::optional<std::string> user_path = a.value("catalog");
  if (!user_path)
    if (auto env = accel::process_env()("ACCEL_CATALOG"); env && !env->empty()) user_path = *env;
  if (user_path) user = accel::read_architecture_catalog(*user_path);
  const auto entries = [](const accel::ArchitectureCatalog& c) {
    std::vector<const accel::Architecture*> out;
    for (const auto& x : c.architectures) out.push_back(&x);
    std::sort(out.begin(), out.end(), [](auto x, auto y) { return x->name < y->name; });
    return out;
  };
  if (a.has("json")) {
    nlohmann::ordered_json j;
    const auto listed = [&](const accel::ArchitectureCatalog& c, const std::string& source) {
      nlohmann::ordered_json o;
      o["source"] = source;
      o["transformers"] = c.transformers_version;
      o["torch"] = c.torch_version;
      o["architectures"] = nlohmann::ordered_json::array();
      for (const auto* x : entries(c))
        o["architectures"].push_back({{"architecture", x->name}, {"model_type", x->model_type}, {"covers", x->covers}});
      o["skipped"] = nlohmann::ordered_json::array();
      for (const auto& [name, reason] : c.skipped) o["skipped"].push_back({{"architecture", name}, {"reason", reason}});
      return o;
    };
    j["catalogs"] = nlohmann::ordered_json::array({listed(embedded, "embedded")});
    if (user) j["catalogs"].push_back(listed(*user, *user_path));
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const auto print = [&](const accel::ArchitectureCatalog& c, const std::string& source) {
    std::printf("%zu architectures in %s (transformers %s):\n", c.architectures.size(), source.c_str(), c.transformers_version.c_str());
    for (const auto* x : entries(c))
      std::printf("  %-48s %-24s %s\n", x->name.c_str(), x->model_type.c_str(), x->covers.c_str());
    if (!c.skipped.empty())
      std::printf("%zu classes of transformers' auto mappings are not in it (accel plan --list-architectures --json says why)\n",
                  c.skipped.size());
  };
  print(embedded, "accel's catalog");
  if (user) print(*user, "catalog " + *user_path);
  return 0;
}

inline int run_plan(std::span<char*> argv) {
  const auto a = parse_args(argv, {plan_options});
  if (a.help()) {
    std::fputs(format_help(plan_usage, plan_options).c_str(), stdout);
    return 0;
  }
  if (a.has("list-architectures")) return list_architectures(a);
  const std::string like = a.value("like").value_or("transformers");
  if (like != "transformers" && like != "accelerate")
    throw accel::usage_error("plan: --like '" + like + "' is not transformers or accelerate");
  const auto names = accel::parse_map_names(a.value("names").value_or("model"));
  const bool defaulted = !a.has("max-memory");
  // The GPUs: measured for the budgets, or counted for --gpus_per_process's group (checked before
  // any file is read).
  const bool staged = a.has("stages");
  if (a.has("replicas") && !staged)
    throw accel::usage_error("plan: " + a.spelling("replicas") + " gives the replicas of a pipeline; give its stages too "
                             "(--stages S), or drop " + a.spelling("replicas"));
  if (staged && a.has("json-report"))
    throw accel::usage_error("plan: --json-report describes one device map; with --stages use --json (every stage's map, "
                             "bytes and time)");
  auto gpus = defaulted || a.has("gpus-per-process") || (staged && a.has("simulate-gpus")) ? plan_gpus(a, defaulted)
                                                                                         : std::vector<accel::DeviceBudgetInfo>{};
  const auto group = gpu_group(a, "plan", static_cast<int>(gpus.size()),
                               accel::parse_visible_devices(accel::process_env()("CUDA_VISIBLE_DEVICES")),
                               "run it where the job's GPUs are, or give them with --simulate-gpus SIZES");
  StageLayout layout;
  if (staged) {
    layout.stages = *a.integer("stages");
    layout.replicas = a.integer("replicas").value_or(1);
    if (const long long ranks = static_cast<long long>(layout.stages) * layout.replicas; ranks > max_pipeline_ranks)
      throw accel::usage_error(accel::detail::concat("plan: ", layout.stages, " stages x ", layout.replicas, " replicas make ", ranks,
                                                     " ranks, more than accel launch starts (", max_pipeline_ranks,
                                                     "); give fewer stages or replicas"));
    layout.gpus_per_process = group ? group->gpus_per_process : 1;
    layout.local_processes = gpus.empty() ? layout.ranks() : static_cast<int>(gpus.size()) / layout.gpus_per_process;
    if (group && group->process >= layout.ranks())
      throw accel::usage_error("plan: " + a.spelling("process") + " " + std::to_string(group->process) + " holds no rank: " +
                               std::to_string(layout.stages) + " stages x " + accel::text::plural(layout.replicas, "replica") +
                               " make " + accel::text::plural(layout.ranks(), "rank") + ", held by local processes 0" +
                               (layout.ranks() > 1 ? " to " + std::to_string(layout.ranks() - 1) : std::string()) +
                               "; give one of those");
  } else if (group) {
    gpus = group_gpus(gpus, *group);
  }
  auto model = load_model(a, "plan", explicit_dtype(a));
  accel::PlanOptions opts;
  std::vector<accel::MaxMemory> stage_budgets;
  if (staged && defaulted) {
    stage_budgets = measured_stage_budgets(gpus, layout, measured_ram(gpus));
    opts.max_memory = stage_budgets.front();
  } else {
    opts.max_memory = defaulted ? measured_budgets(gpus) : accel::parse_max_memory(*a.value("max-memory"));
    if (staged) stage_budgets.assign(static_cast<std::size_t>(layout.stages), opts.max_memory);
  }
  if (group) accel::require_group_budgets(opts.max_memory, group->devices.size(), group->gpus());
  const auto mode = accel::parse_device_map_mode(a.value("device-map").value_or("auto"));
  // The dtype: the same decision `accel load` converts with (model_args.hpp).
  auto dtype = choose_dtype(a, model);
  opts.dtype = dtype.dtype;
  opts.keep_in_fp32 = std::move(dtype.keep_in_fp32);
  // no-split: given (each must match), 'none', the catalog's classes, or numbered children;
  // accelerate as called without no_split_module_classes has no blocks.
  auto blocks = choose_blocks(a, model, like == "transformers", "plan");
  if (like == "accelerate" && blocks.automatic) blocks = {{}, false, "none (--like accelerate without --no-split)"};
  opts.no_split = blocks.specs;
  opts.auto_no_split = blocks.automatic;
  const std::string& blocks_note = blocks.note;
  if (like == "transformers") opts.rules = accel::PlanRules::transformers;
  else opts.accelerate_dtype_rule = true;
  // A quantized checkpoint: its weights count as stored (Tensor::quantized) and, as transformers'
  // quantizer adjusts max_memory, bitsandbytes plans with 90% of every budget.
  const auto* quantized = model.checkpoint && model.checkpoint->quantization ? &*model.checkpoint->quantization : nullptr;
  if (like == "transformers" && model.checkpoint) opts.budget_scale = model.checkpoint->budget_scale();
  opts.offload_buffers = a.has("offload-buffers");
  opts.fallback_allocation = a.has("fallback");
  if (auto n = a.value("gpu-reserve-layers"))
    opts.gpu_reserve_layers = static_cast<std::uint32_t>(parse_int_option("--gpu-reserve-layers", *n, 1, 64));
  opts.clean_result = !a.has("no-clean");
  if (a.has("verbose")) opts.verbose = &std::cerr;
  opts.objective = accel::parse_plan_objective(a.value("objective").value_or("fit"));
  const auto [bw, rates_note] = choose_bandwidths(a);
  opts.bandwidths = bw;
  if (staged) {
    std::string header = "accel plan: " + model.label + ", " + std::to_string(model.tree.tensors().size()) + " tensors, mode " +
                         std::string(a.value("device-map").value_or("auto")) + ", " +
                         accel::text::plural(layout.stages, "stage") + " x " + accel::text::plural(layout.replicas, "replica") +
                         " (" + accel::text::plural(layout.ranks(), "rank") + ", rank = replica*" + std::to_string(layout.stages) +
                         " + stage)\n";
    if (model.checkpoint) header += "architecture: " + model.checkpoint->architecture_note + "\n";
    header += "blocks: " + blocks_note + "; rules: " + like + "; dtype: " + dtype.note + "\n";
    if (group)
      header += accel::detail::concat("processes: ", accel::text::plural(layout.gpus_per_process, "GPU"), " each, ", layout.local_processes,
                                      " on this machine; --process ", group->process, " is ", group->describe(), "\n");
    return run_plan_stages(a, model, opts, mode, defaulted, stage_budgets, layout, header, rates_note, names,
                           group ? std::optional<int>(group->process) : std::nullopt);
  }

  // Computed once: the balancing, the placement and the drawing all use them.
  const auto sizes = accel::compute_module_sizes(model.tree, accel::size_options(opts));
  const auto budgets = opts.max_memory;
  const auto plan = accel::plan_device_map(model.tree, sizes, mode, opts, defaulted);
  const auto report = accel::make_plan_report(plan, bw);
  // Both objectives side by side: the speed plan carries the comparison; for fit it is computed here,
  // unless only the map is printed (--json alone).
  const bool map_only = a.has("json") && !a.has("json-report") && !a.has("svg");
  const accel::ObjectiveComparison objectives =
      plan.objectives ? *plan.objectives
      : map_only      ? accel::ObjectiveComparison{}
                      : accel::plan_speed_objective(model.tree, sizes, opts, plan).comparison;
  const std::string objectives_text = map_only ? std::string() : accel::format_objective_comparison(objectives, plan.objective, rates_note);
  const std::string quantization = quantized ? accel::quantization_summary(*quantized, opts.dtype) : std::string();
  if (quantized && quantized->config.transformers_gpu_only &&
      std::any_of(plan.device_map.begin(), plan.device_map.end(), [](const auto& e) { return !e.second.is_gpu(); }))
    model.checkpoint->warnings.push_back(
        "transformers refuses this map for a bitsandbytes checkpoint (modules on cpu or disk need "
        "llm_int8_enable_fp32_cpu_offload in quantization_config); accel loads it as stored");
  if (auto svg_path = a.value("svg")) {
    std::vector<std::vector<KeySize>> keys(plan.devices.size());
    for (const auto& [key, where] : plan.device_map) {
      std::uint64_t bytes = key.empty() ? sizes.total() : 0;
      if (auto m = model.tree.find_module(key); m && !key.empty()) bytes = sizes.module[*m];
      else if (auto t = model.tree.find_tensor(key)) bytes = sizes.tensor[*t];
      for (std::size_t i = 0; i < plan.devices.size(); ++i)
        if (plan.devices[i].device == where) keys[i].push_back({key, bytes});
    }
    std::ofstream out(*svg_path, std::ios::trunc);
    out << render_plan_svg(plan, report, keys,
                           "accel plan: " + model.label + " (" + std::string(a.value("device-map").value_or("auto")) + ")" +
                               (quantized ? "; " + quantization : std::string()),
                           objectives_text.substr(0, objectives_text.find('\n')));
    if (!out)
      throw accel::usage_error("plan: cannot write the SVG to '" + *svg_path + "'; check the path");
  }
  const bool renamed = model.checkpoint && !model.checkpoint->names.identity();
  const auto written = names == accel::MapNames::checkpoint && renamed
                           ? accel::to_checkpoint_names(plan.device_map, model.checkpoint->names)
                           : plan.device_map;
  if (a.has("json-report")) {
    std::printf("%s\n", plan_report_json(plan, written, objectives, rates_note).dump(2).c_str());
    if (model.checkpoint)
      for (const auto& w : model.checkpoint->warnings) std::fprintf(stderr, "accel plan: warning: %s\n", w.c_str());
    return 0;
  }
  if (a.has("json")) {
    std::printf("%s\n", written.to_json_string(2).c_str());
    if (model.checkpoint)
      for (const auto& w : model.checkpoint->warnings) std::fprintf(stderr, "accel plan: warning: %s\n", w.c_str());
    return 0;
  }
  std::printf("accel plan: %s, %zu tensors, %s, mode %s\n", model.label.c_str(), model.tree.tensors().size(),
              accel::text::format_bytes(plan.total_bytes).c_str(), a.value("device-map").value_or("auto").c_str());
  if (model.checkpoint) std::printf("architecture: %s\n", model.checkpoint->architecture_note.c_str());
  if (renamed) std::printf("names: the map is in %s names (checkpoint names renamed as %s renames them)\n",
                           std::string(accel::map_names_name(names)).c_str(), model.checkpoint->names.source.c_str());
  std::printf("blocks: %s; rules: %s; dtype: %s\n", blocks_note.c_str(), like.c_str(), dtype.note.c_str());
  if (quantized) std::printf("quantization: %s\n", quantization.c_str());
  if (model.checkpoint)
    for (const auto& w : model.checkpoint->warnings) std::printf("warning: %s\n", w.c_str());
  if (group)
    std::printf("group: %s; the map's GPU keys 0%s index it\n", group->describe().c_str(),
                group->devices.size() > 1 ? ("-" + std::to_string(group->devices.size() - 1)).c_str() : "");
  std::printf("budgets%s: %s\n", defaulted ? " (measured: free GPU memory minus max(1 GiB, 10%), 90% of available RAM)" : "",
              budgets.to_string().c_str());
  for (const auto& line : plan.balancing) std::printf("  %s\n", line.c_str());
  std::printf("\n");
  std::fputs(accel::format_plan_table(plan, report).c_str(), stdout);
  std::fputs(objectives_text.c_str(), stdout);
  const char* usable = names == accel::MapNames::model ? "from_pretrained's device_map=" : "load_checkpoint_and_dispatch";
  if (written.size() <= 40)
    std::printf("\ndevice map (HF JSON, %s names, usable as %s):\n%s\n", std::string(accel::map_names_name(names)).c_str(),
                usable, written.to_json_string().c_str());
  else
    std::printf("\ndevice map: %zu entries in %s names; print it with --json\n", written.size(),
                std::string(accel::map_names_name(names)).c_str());
  return 0;
}

inline int run_estimate_memory(std::span<char*> argv) {
  const auto a = parse_args(argv, {estimate_options});
  if (a.help()) {
    std::fputs(format_help(estimate_usage, estimate_options).c_str(), stdout);
    return 0;
  }
  auto model = load_model(a, "estimate-memory");
  const auto& tree = model.tree;
  std::vector<std::string> rows;
  {
    const std::string list = a.value("dtypes").value_or("float32,float16,int8,int4");
    std::size_t start = 0;
    while (start <= list.size()) {
      auto comma = list.find(',', start);
      auto item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (!item.empty()) rows.push_back(item);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  const auto cached = tree.index();
  const accel::TreeIndex& ix = *cached;
  const auto blocks = choose_blocks(a, model, true, "estimate-memory");
  const auto no_split = accel::no_split_modules(tree, blocks.specs, blocks.automatic);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::string table = "dtype       largest layer                          total size\n";
  for (const auto& row : rows) {
    unsigned bits = 0;
    if (row == "int4") bits = 4;
    else bits = accel::bit_size(accel::dtype_from_string(row));
    accel::ModuleSizes sizes;
    sizes.tensor.assign(tree.tensors().size(), 0);
    sizes.module.assign(tree.modules().size(), 0);
    sizes.module_buffers.assign(tree.modules().size(), 0);
    for (std::size_t t = 0; t < tree.tensors().size(); ++t) {
      if (ix.canonical[t] != t) continue;
      const auto& ten = tree.tensors()[t];
      // computed buffers and quantized tensors keep theirs
      const bool own = accel::is_integral(ten.dtype) || (ten.buffer && !ten.persistent) || ten.quantized;
      const std::uint64_t bytes = own ? ten.numel() * accel::bit_size(ten.dtype) / 8 : ten.numel() * bits / 8;
      sizes.tensor[t] = bytes;
      sizes.module[ten.module] += bytes;
    }
    for (std::size_t m = tree.modules().size(); m-- > 1;) sizes.module[tree.modules()[m].parent] += sizes.module[m];
    const auto largest = accel::largest_layer(tree, sizes, no_split);
    out.push_back({{"dtype", row}, {"largest_layer", largest.name}, {"largest_layer_bytes", largest.bytes},
                   {"total_bytes", sizes.total()}});
    if (model.checkpoint && model.checkpoint->quantization) {  // the quantized weights count as stored in every row
      const auto& q = *model.checkpoint->quantization;
      out.back()["quantization"] = {{"method", q.config.quant_method}, {"description", q.config.description},
                                    {"stored_bytes", q.stored_bytes}, {"bytes_saved", q.bytes_saved(bits)}};
    }
    std::string line = row;
    line.resize(12, ' ');
    std::string l = accel::text::format_bytes(largest.bytes) + " (" + (largest.name.empty() ? "-" : largest.name) + ")";
    if (l.size() > 38) l = l.substr(0, 35) + "...";
    line += l;
    line.resize(51, ' ');
    table += line + accel::text::format_bytes(sizes.total()) + "\n";
  }
  if (a.has("json")) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("memory for %s (%zu tensors, headers only; shared tensors counted once)\n", model.label.c_str(),
              tree.tensors().size());
  if (model.checkpoint) std::printf("architecture: %s\n", model.checkpoint->architecture_note.c_str());
  if (model.checkpoint)
    for (const auto& w : model.checkpoint->warnings) std::printf("warning: %s\n", w.c_str());
  if (model.checkpoint && model.checkpoint->quantization)
    std::printf("quantization: %s; every row counts the quantized weights as stored\n",
                accel::quantization_summary(*model.checkpoint->quantization, accel::DType::F16).c_str());
  std::printf("blocks: %s\n\n%s", blocks.note.c_str(), table.c_str());
  return 0;
}

}  // namespace accel_cli
