// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel load`: validates a checkpoint, plans (or reads) a device map, loads every tensor onto
// GPUs / CPU / disk, and prints per-device totals and the load rate: a checkpoint checker and a
// load benchmark in one.
#pragma once

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/load/auto_dispatch.hpp>
#include <accel/load/dispatch.hpp>
#include <accel/load/offload.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/model/checkpoint_tree.hpp>
#include <accel/model/module_tree.hpp>
#include <accel/model/skeleton.hpp>
#include <accel/plan/planner.hpp>

#include "args.hpp"
#include "gpu_group.hpp"
#include "model_args.hpp"
#include "plan_stages.hpp"

namespace accel_cli {

inline constexpr OptionSpec load_options[] = {
    {"checkpoint", OptionKind::text, "PATH", "safetensors file, model.safetensors.index.json or folder"},
    {"config", OptionKind::text, "FILE", "the model's config.json when it is not next to the checkpoint"},
    {"catalog", OptionKind::text, "FILE", "a catalog of architectures newer than accel's (tests/compat/gen_user_catalog.py "
                                          "writes one from your transformers), searched first; default: $ACCEL_CATALOG"},
    {"no-catalog", OptionKind::flag, "", "plan from headers and name heuristics only, as for an architecture no catalog knows"},
    {"device-map", OptionKind::text, "MAP", "a JSON file or object (keys in the model's names, as accel plan writes "
                                            "them, or the checkpoint's), or a mode: auto (default), balanced, "
                                            "balanced_low_0, sequential"},
    {"max-memory", OptionKind::text, "BUDGETS", "budgets for planning modes: '0=20GiB,cpu=64GiB' or JSON; default: measured"},
    {"objective", OptionKind::text, "WHAT", "planning modes: fit (default: transformers' map) or speed (the fewest weight "
                                            "bytes streamed per forward pass within the same budgets)"},
    {"no-split", OptionKind::text, "CLASS_OR_GLOB", "planning: never split these modules (class name, module name or glob; "
                                                    "'none': no blocks); default: the catalog's classes", true},
    {"dtype", OptionKind::text, "DTYPE", "load floating tensors as float32, float16, bfloat16 or auto (the config's; "
                                         "default auto with a config.json, else as stored)"},
    {"keep-in-fp32", OptionKind::text, "PATTERN", "tensors loaded as float32 (matched as transformers does; the "
                                                  "catalog's keep-in-fp32 modules are added)", true},
    {"offload-folder", OptionKind::text, "DIR", "offload folder for disk tensors whose dtype changes"},
    {"cpu-memory", OptionKind::text, "KIND", "pageable (default), pinned or zero-copy"},
    {"strict", OptionKind::flag, "", "fail on tensors the device map does not cover"},
    {"simulate-gpus", OptionKind::text, "SIZES", "use host-simulated GPUs of these sizes ('8GiB,8GiB') instead of CUDA"},
    {"staging", OptionKind::text, "SIZE", "size of each pinned staging buffer (default 32MiB)"},
    {"dump-dir", OptionKind::text, "DIR", "after loading, write every loaded tensor (as loaded: converted, copied back "
                                          "from GPUs) to DIR in accelerate's offload-folder format, for checking"},
    {"quiet", OptionKind::flag, "", "no progress bar"},
    {"json", OptionKind::flag, "", "print the load report as JSON"},
    gpus_per_process_option,
    process_option,
    stages_option,
    replicas_option,
};

inline constexpr const char* load_usage = R"(usage: accel load --checkpoint PATH [--device-map FILE|JSON|MODE] [options]

Validates every header of the checkpoint (before allocating anything), builds the model as
`accel plan` does (config.json and the architecture catalog: the dtype `auto` resolves to, the
keep-in-fp32 modules, the no-split classes, buffers and ties), plans a device map unless one is
given, loads each tensor onto its GPU, CPU memory or disk (disk tensors stay views into the shards
unless their dtype changes), and prints per device the tensors and bytes placed and the load rate.
Map keys that cover only what the model computes or ties (rotary buffers, a tied lm_head) are
accepted silently; other keys covering no checkpoint tensor are listed. Exit status: 0; 2 bad
arguments; 3 bad device map or budgets; 4 GPU not available; 5 infeasible plan; 6 bad checkpoint;
9 out of device memory or another CUDA failure; 70 internal error.

With --gpus_per_process K [--process R] it loads as local process R of a job with K GPUs per
process would (load_checkpoint_and_dispatch with its DistributedState): on the visible GPUs R*K to
R*K+K-1 only (of --simulate-gpus' when given), which the map's and --max-memory's GPU keys index
(0 = the group's first).)

With --stages S [--replicas R] [--process P] it loads only rank P's pipeline stage, P % S (rank =
replica*S + stage, as grid_groups numbers them; P < S*R): the stages as `accel plan --stages S`
plans them with --max-memory as each stage's process's budgets, then that stage's tensors only
(plan_pipeline_load, load_stage), and prints its units and its bytes, planned and loaded.)";

namespace detail_load {

inline accel::CpuMemory parse_cpu_memory(const std::string& s) {
  if (s == "pageable") return accel::CpuMemory::pageable;
  if (s == "pinned") return accel::CpuMemory::pinned;
  if (s == "zero-copy" || s == "zero_copy") return accel::CpuMemory::zero_copy;
  throw accel::usage_error("load: --cpu-memory '" + s + "' is not pageable, pinned or zero-copy");
}

// `cuda:1`, `cpu`, `disk`; with a group, its GPU i is named as the machine names it (`cuda:3`).
inline std::string placement_label(const accel::Placement& p, const std::optional<GpuGroup>& group = std::nullopt) {
  if (p.is_gpu() && group && p.index >= 0 && static_cast<std::size_t>(p.index) < group->devices.size())
    return group->devices[static_cast<std::size_t>(p.index)].to_string();
  return p.is_gpu() ? "cuda:" + p.to_string() : p.to_string();
}

}  // namespace detail_load

// A tensor the dump cannot store as `<name>.dat` ('/', NUL, too long): a checkpoint problem, found
// from the checkpoint's names before anything is loaded or written (run_load).
inline void check_dump_name(std::string_view name) {
  if (auto why = accel::offload_name_problem(name))
    throw accel::checkpoint_error("load: tensor '" + accel::text::printable(name) + "' cannot be written by --dump-dir: " +
                                  *why + " (a dumped tensor is the file <name>.dat); dump another checkpoint or rename the tensor");
}

// `--dump-dir`: every loaded tensor, as loaded, in accelerate's offload-folder format (index.json
// + one raw `.dat` per tensor); GPU tensors are copied back through their device.
// The folder is cleared of what it must not hold in the dump's names (links, temporaries; the
// links removed are reported on stderr) and every file is created in it, never through a link.
inline void dump_loaded_tensors(const accel::DispatchedModel& model, const std::vector<accel::DeviceMemoryPtr>& devices,
                                const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw accel::config_error("load: cannot create dump folder '" + dir.string() + "': " + ec.message());
  if (const auto warning = accel::clean_offload_folder(dir).links_warning(dir); !warning.empty())
    std::fprintf(stderr, "accel load: warning: %s\n", warning.c_str());
  accel::OffloadIndex index;
  std::vector<std::byte> staging;
  for (const auto& t : model.tensors()) {
    std::span<const std::byte> bytes = t.host;
    if (t.storage == accel::Storage::device) {
      const auto& dev = devices.at(static_cast<std::size_t>(t.placement.index));
      staging.resize(t.size_bytes);
      auto stream = dev->create_stream();
      dev->copy_to_host_async(staging.data(), t.device_ptr, t.size_bytes, stream);
      dev->synchronize(stream);
      dev->destroy_stream(stream);
      bytes = staging;
    }
    accel::offload_weight(dir, t.name, t.dtype, t.shape, bytes, index);
  }
  accel::write_offload_index(dir, index);
}

// `accel load --stages S [--replicas R] [--process P]`: rank P's stage of the pipeline, alone.
inline int run_load_stage(const ParsedArgs& a, const std::string& path, accel::LoadOptions opts) {
  const int stages = *a.integer("stages"), replicas = a.integer("replicas").value_or(1), rank = a.integer("process").value_or(0);
  if (rank >= stages * replicas)
    throw accel::usage_error("load: --process " + std::to_string(rank) + " with --stages " + std::to_string(stages) + " and --replicas " +
                             std::to_string(replicas) + "; ranks are 0 to " + std::to_string(stages * replicas - 1));
  if (a.has("dump-dir") || a.has("strict"))
    throw accel::usage_error("load: --stages loads one stage; --dump-dir and --strict are for the whole model");
  if (a.has("gpus-per-process")) {  // local process P's group, as without --stages
    const auto group = gpu_group(a, "load", static_cast<int>(opts.devices->size()),
                                 accel::parse_visible_devices(accel::process_env()("CUDA_VISIBLE_DEVICES")),
                                 "run it where the job's GPUs are, or give them with --simulate-gpus SIZES");
    std::vector<accel::DeviceMemoryPtr> mine;
    for (const auto& d : group->devices) mine.push_back((*opts.devices)[static_cast<std::size_t>(d.index())]);
    opts.devices = std::move(mine);
  }
  opts.progress = !a.has("quiet") && !a.has("json");
  accel::AutoDispatchOptions o;
  o.stages = stages;
  o.device_map = a.value("device-map").value_or("auto");
  o.objective = accel::parse_plan_objective(a.value("objective").value_or("fit"));
  if (auto m = a.value("max-memory")) o.max_memory = accel::parse_max_memory(*m);
  if (auto c = a.value("config")) o.config_file = *c;
  if (auto c = a.value("catalog")) o.catalog_file = *c;
  else if (auto env = accel::process_env()("ACCEL_CATALOG"); env && !env->empty()) o.catalog_file = *env;
  for (const auto& n : a.values("no-split"))
    if (n != "none") o.no_split.push_back(n);
  opts.dtype = explicit_dtype(a);
  opts.keep_in_fp32 = a.values("keep-in-fp32");
  o.load = std::move(opts);
  const auto checkpoint = accel::resolve_checkpoint(path);
  const auto plan = accel::plan_pipeline_load(checkpoint, o);
  const int stage = rank % stages;
  const auto& st = plan.pipeline.stages[static_cast<std::size_t>(stage)];
  const auto& extra = plan.stage_loads[static_cast<std::size_t>(stage)];
  const auto loaded = accel::load_stage(checkpoint, plan, stage);
  const auto& r = loaded.report();
  const std::string units = stage_units_text(plan.pipeline, st);
  if (a.has("json")) {
    nlohmann::ordered_json j;
    j["checkpoint"] = path;
    j["architecture"] = plan.architecture;
    j["rank"] = rank;
    j["stage"] = stage;
    j["replica"] = rank / stages;
    j["stages"] = stages;
    j["units"] = units;
    j["planned_bytes"] = st.bytes;
    j["computed_bytes"] = extra.computed_bytes;
    j["bytes_loaded"] = r.bytes_loaded;
    j["tensors"] = loaded.tensors().size();
    j["tied_copies"] = st.tied_copies;
    j["device_map"] = st.plan.device_map.to_json();
    for (const auto& [p, tot] : r.per_placement) j["devices"][p.to_string()] = {{"tensors", tot.tensors}, {"bytes", tot.bytes}};
    j["seconds"] = r.seconds;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  const auto bytes = [](std::uint64_t b) { return accel::text::format_bytes(b, accel::text::ByteStyle::significant3); };
  std::printf("accel load: %s, rank %d: stage %d of %d (replica %d): %s\n", path.c_str(), rank, stage, stages, rank / stages,
              units.c_str());
  std::printf("architecture: %s\nplanned: %s (%s on GPUs, %s cpu, %s disk)", plan.architecture.c_str(), bytes(st.bytes).c_str(),
              bytes(st.gpu_bytes).c_str(), bytes(st.cpu_bytes).c_str(), bytes(st.disk_bytes).c_str());
  if (extra.computed_bytes) std::printf(", of which %s computed by the model (not loaded)", bytes(extra.computed_bytes).c_str());
  std::printf("\nloaded: %zu tensors, %s in %.3f s\n", loaded.tensors().size(), bytes(r.bytes_loaded).c_str(), r.seconds);
  for (const auto& [p, tot] : r.per_placement)
    std::printf("  %-10s %8zu %12s\n", detail_load::placement_label(p).c_str(), tot.tensors, bytes(tot.bytes).c_str());
  for (const auto& t : st.tied_copies) std::printf("tied: holds %s: its own copy, loaded from the checkpoint\n", t.c_str());
  for (const auto& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  return 0;
}

inline int run_load(std::span<char*> argv) {
  namespace fs = std::filesystem;
  const auto a = parse_args(argv, {load_options});
  if (a.help()) {
    std::fputs(format_help(load_usage, load_options).c_str(), stdout);
    return 0;
  }
  const auto path = a.value("checkpoint");
  if (!path) throw accel::usage_error("load: --checkpoint PATH is required");
  // A write past the file-size limit (ulimit -f) then fails with EFBIG, reported as a config_error
  // naming the file, instead of raising SIGXFSZ, which kills the process mid-write. (The writers
  // also check sizes against the limit first; this covers any write they do not foresee.)
  std::signal(SIGXFSZ, SIG_IGN);

  accel::LoadOptions opts;
  opts.devices = a.has("simulate-gpus") ? accel::host_simulated_devices(parse_simulated_sizes(*a.value("simulate-gpus"), "load"))
                                        : accel::cuda_device_memories();
  if (auto f = a.value("offload-folder")) opts.offload_folder = *f;
  if (auto c = a.value("config")) opts.config_file = *c;
  if (auto c = a.value("cpu-memory")) opts.cpu_memory = detail_load::parse_cpu_memory(*c);
  if (auto s = a.value("staging")) opts.staging_bytes = std::max<std::uint64_t>(accel::parse_byte_size(*s), 4096);
  if (a.has("stages")) return run_load_stage(a, *path, std::move(opts));
  if (a.has("replicas")) throw accel::usage_error("load: --replicas needs --stages S");
  const auto group = gpu_group(a, "load", static_cast<int>(opts.devices->size()),
                               accel::parse_visible_devices(accel::process_env()("CUDA_VISIBLE_DEVICES")),
                               "run it where the job's GPUs are, or give them with --simulate-gpus SIZES");
  if (group) {  // only the group's GPUs, in its order: the map's GPU i is its i-th
    std::vector<accel::DeviceMemoryPtr> mine;
    for (const auto& d : group->devices) mine.push_back((*opts.devices)[static_cast<std::size_t>(d.index())]);
    opts.devices = std::move(mine);
  }
  opts.strict = a.has("strict");
  opts.progress = !a.has("quiet") && !a.has("json");
  const auto requested_dtype = explicit_dtype(a);  // checks the name before any file is read
  auto same_folder = [](const fs::path& x, const fs::path& y) {
    std::error_code ex, ey;
    const auto cx = fs::weakly_canonical(x, ex), cy = fs::weakly_canonical(y, ey);
    return !ex && !ey && cx == cy;
  };
  if (auto dump = a.value("dump-dir"); dump && !opts.offload_folder.empty() && same_folder(*dump, opts.offload_folder))
    throw accel::usage_error("load: --dump-dir and --offload-folder name the same folder; the dump would replace the "
                             "offload folder's index: choose another folder");

  // The device map: a file, inline JSON, or planned. A given map is parsed before the checkpoint's
  // headers are read, so a bad map is reported before a bad checkpoint.
  const std::string map_arg = a.value("device-map").value_or("auto");
  const auto objective = accel::parse_plan_objective(a.value("objective").value_or("fit"));
  accel::DeviceMap map;
  std::string map_source;
  std::optional<accel::DeviceMapMode> mode;
  std::error_code ec;
  const auto is_mode = [](std::string_view m) { return m == "auto" || m == "balanced" || m == "balanced_low_0" || m == "sequential"; };
  if (!map_arg.empty() && (map_arg.front() == '{' || map_arg.front() == '[')) {
    map = accel::DeviceMap::from_json(map_arg);  // an array is refused as "a JSON array, not an object"
    map_source = "given inline";
  } else if (fs::exists(fs::symlink_status(map_arg, ec))) {
    // Whatever is at that path was meant as the map's file: a folder, a FIFO, a device or a
    // dangling link is reported as what it is (read_text_file), a device map problem.
    try {
      map = accel::DeviceMap::from_json(accel::read_text_file(map_arg, "device map file"));
    } catch (const accel::checkpoint_error& e) {
      throw accel::config_error(std::string("load: ") + (e.what() + e.category().size() + std::strlen("[accel.] ")));
    }
    map_source = "from " + map_arg;
  } else if (!is_mode(map_arg) && (map_arg.find('/') != std::string::npos || map_arg.ends_with(".json"))) {
    throw accel::config_error("load: device map file '" + map_arg + "' does not exist; pass a JSON file, inline JSON, "
                              "or a mode: auto, balanced, balanced_low_0 or sequential");
  } else {
    mode = accel::parse_device_map_mode(map_arg);
  }
  if (!mode && a.has("objective"))
    throw accel::usage_error("load: --objective plans a map; it has no effect with a given --device-map (" + map_source +
                             "); drop one of them");

  // The model as `accel plan` builds it (model_args.hpp): its dtype decision is the one the
  // planner sizes with, so a map planned with the same arguments fits what is loaded.
  const auto checkpoint = accel::resolve_checkpoint(*path);
  if (a.has("dump-dir"))
    for (auto name : checkpoint.tensor_names) check_dump_name(name);
  const auto model = model_of_checkpoint(checkpoint, *path, a, requested_dtype);
  auto dtype = choose_dtype(a, model);
  opts.dtype = dtype.dtype;
  opts.keep_in_fp32 = dtype.keep_in_fp32;
  std::string blocks_note;
  if (mode) {
    const bool defaulted = !a.has("max-memory");
    auto budgets = defaulted ? accel::measured_max_memory(*opts.devices) : accel::parse_max_memory(*a.value("max-memory"));
    if (group) accel::require_group_budgets(budgets, group->devices.size(), group->gpus());
    auto plan = accel::load_plan_options(std::move(budgets), *opts.devices, opts);
    plan.budget_scale = model.checkpoint->budget_scale();
    plan.objective = objective;
    const auto blocks = choose_blocks(a, model, true, "load");
    plan.no_split = blocks.specs;
    plan.auto_no_split = blocks.automatic;
    blocks_note = blocks.note;
    const auto planned = accel::plan_device_map(model.tree, *mode, plan, defaulted);
    map = planned.device_map;
    opts = accel::planned_load_options(std::move(opts), model.tree, model.checkpoint->names, planned);
    map_source = "planned (" + map_arg + (objective == accel::PlanObjective::speed ? ", objective speed" : "") + ", budgets " +
                 plan.max_memory.to_string() + ")";
  }

  auto loaded = accel::load_checkpoint_and_dispatch(checkpoint, map, opts);
  const auto& r = loaded.report();
  const auto unused = accel::classify_unused_keys(model.tree, r.unused_keys);
  if (auto dir = a.value("dump-dir")) dump_loaded_tensors(loaded, *opts.devices, *dir);
  std::map<accel::Placement, std::map<std::string, std::size_t>> storage;
  for (const auto& t : loaded.tensors()) ++storage[t.placement][std::string(accel::storage_name(t.storage))];
  const std::string& architecture = model.checkpoint->architecture_note;

  if (a.has("json")) {
    nlohmann::ordered_json j;
    j["checkpoint"] = *path;
    j["architecture"] = architecture;
    j["dtype"] = dtype.dtype ? nlohmann::ordered_json(std::string(accel::torch_name(*dtype.dtype))) : nlohmann::ordered_json(nullptr);
    j["keep_in_fp32"] = dtype.keep_in_fp32;
    if (const auto& q = model.checkpoint->quantization)
      j["quantization"] = {{"method", q->config.quant_method}, {"description", q->config.description},
                           {"quantized_weights", q->modules}, {"stored_bytes", q->stored_bytes}};
    if (group) {
      j["group"] = {{"process", group->process}, {"gpus_per_process", group->gpus_per_process}, {"devices", nlohmann::ordered_json::array()},
                    {"physical_gpus", group->physical}};
      for (const auto& d : group->devices) j["group"]["devices"].push_back(d.to_string());
    }
    j["device_map"] = map.to_json();
    for (const auto& [p, tot] : r.per_placement) {
      nlohmann::ordered_json s = nlohmann::ordered_json::object();
      for (const auto& [k, n] : storage[p]) s[k] = n;
      j["devices"][p.to_string()] = {{"tensors", tot.tensors}, {"bytes", tot.bytes}, {"storage", s}};
    }
    j["bytes_loaded"] = r.bytes_loaded;
    j["bytes_copied"] = r.bytes_copied;
    j["seconds"] = r.seconds;
    j["copy_bytes_per_second"] = r.copy_rate();
    j["unexpected"] = r.unexpected;
    j["missing"] = r.missing;
    j["unused_device_map_keys"] = unused.unknown;
    j["model_only_device_map_keys"] = unused.model_only;
    j["offload_written"] = r.offload_written;
    j["offload_reused"] = r.offload_reused;
    j["execution_device"] = loaded.execution_device() ? nlohmann::ordered_json(*loaded.execution_device()) : nlohmann::ordered_json(nullptr);
    j["fetch_buffers"] = loaded.fetch_buffer_count();
    j["fetch_buffer_bytes"] = loaded.fetch_buffer_bytes();
    j["warnings"] = r.warnings;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("accel load: %s (%zu tensors, %s), device map %s\n", path->c_str(), loaded.tensors().size(),
              accel::text::format_bytes(r.bytes_loaded, accel::text::ByteStyle::significant3).c_str(), map_source.c_str());
  if (group) std::printf("group: %s; the map's GPU keys index it\n", group->describe().c_str());
  std::printf("architecture: %s\ndtype: %s", architecture.c_str(), dtype.note.c_str());
  if (!dtype.keep_in_fp32.empty()) std::printf(", float32: %s", accel::text::quoted_list(dtype.keep_in_fp32).c_str());
  if (mode) std::printf("; blocks: %s", blocks_note.c_str());
  if (const auto& q = model.checkpoint->quantization)
    std::printf("\nquantization: %s; loaded as stored", accel::quantization_summary(*q, dtype.dtype).c_str());
  std::printf("\n\n%-10s %8s %12s  %s\n", "device", "tensors", "bytes", "held as");
  for (const auto& [p, tot] : r.per_placement) {
    std::string held;
    for (const auto& [k, n] : storage[p]) held += (held.empty() ? "" : ", ") + std::to_string(n) + " " + k;
    std::printf("%-10s %8zu %12s  %s\n", detail_load::placement_label(p, group).c_str(), tot.tensors,
                accel::text::format_bytes(tot.bytes, accel::text::ByteStyle::significant3).c_str(), held.c_str());
  }
  std::printf("\nloaded in %.3f s: %s copied at %s/s", r.seconds,
              accel::text::format_bytes(r.bytes_copied, accel::text::ByteStyle::significant3).c_str(),
              accel::text::format_bytes(r.copy_rate(), accel::text::ByteStyle::significant3).c_str());
  if (r.offload_written + r.offload_reused) std::printf("; offload folder: %zu written, %zu reused", r.offload_written, r.offload_reused);
  std::printf("\n");
  if (!r.unexpected.empty())
    std::printf("warning: %zu checkpoint tensor(s) not covered by the device map were skipped: %s\n", r.unexpected.size(),
                accel::text::quoted_list(r.unexpected).c_str());
  if (!unused.unknown.empty())
    std::printf("note: %zu device-map key(s) cover no checkpoint tensor and name nothing the model computes or ties: %s\n",
                unused.unknown.size(), accel::text::quoted_list(unused.unknown).c_str());
  if (loaded.fetch_buffer_bytes())
    std::printf("fetch buffers on %s: %zu x %s (largest offloaded layer)\n",
                detail_load::placement_label(accel::Placement::gpu(loaded.execution_device().value_or(0)), group).c_str(),
                loaded.fetch_buffer_count(), accel::text::format_bytes(loaded.fetch_buffer_bytes(), accel::text::ByteStyle::significant3).c_str());
  if (auto dir = a.value("dump-dir")) std::printf("loaded tensors written to %s (accelerate's offload-folder format)\n", dir->c_str());
  for (const auto& w : r.warnings) std::printf("warning: %s\n", w.c_str());
  return 0;
}

}  // namespace accel_cli
