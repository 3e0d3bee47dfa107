// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan --stages S [--replicas R]`: the model cut into S pipeline stages (plan_pipeline), one
// per process of a replica, each placed on its process's GPU group, CPU and disk share; the report
// (text, --json, --svg) gives per stage its units, bytes, estimated time and ranks, and the
// imbalance beside the split balanced by parameter count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <accel/plan/map_names.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/pipeline_plan.hpp>
#include <accel/runtime/text.hpp>

#include "args.hpp"
#include "gpu_group.hpp"
#include "model_args.hpp"
#include "plan_svg.hpp"

namespace accel_cli {

inline constexpr OptionSpec stages_option = {
    "stages", OptionKind::integer, "S",
    "cut the model into S pipeline stages, one per process of a replica, balanced for the slowest stage's estimated time; "
    "--max-memory then gives one process's budgets", false, 1, 65536};
inline constexpr OptionSpec replicas_option = {
    "replicas", OptionKind::integer, "R",
    "with --stages: R replicas of the S stages (ranks = R*S, rank = replica*S + stage, as grid_groups numbers them)", false, 1, 65536};

/// The most ranks S stages x R replicas may make: accel launch's --num-processes limit (each
/// option alone allows as many, so their product is checked before any rank number is computed).
inline constexpr long long max_pipeline_ranks = 65536;

/// Where the stages' processes are: S stages x R replicas, K GPUs each, P local processes on this
/// machine (rank r is local process r % P: every machine alike).
struct StageLayout {
  int stages = 1;
  int replicas = 1;
  int gpus_per_process = 1;
  int local_processes = 0;  ///< processes this machine holds (visible GPUs / K; without GPUs: every rank)
  [[nodiscard]] int ranks() const noexcept { return stages * replicas; }
  /// @brief The ranks holding stage `s`: replica j's is j * stages + s (grid_groups' numbering).
  [[nodiscard]] std::vector<int> ranks_of(int s) const {
    std::vector<int> out;
    for (int j = 0; j < replicas; ++j) out.push_back(j * stages + s);
    return out;
  }
};

// Each stage's process budgets, measured: the GPUs of its local process's group and its share of
// RAM, the smallest over the replicas' processes holding that stage (so every replica's copy of
// the plan fits). `gpus` are every GPU visible (or simulated), indexed from 0.
inline std::vector<accel::MaxMemory> measured_stage_budgets(const std::vector<accel::DeviceBudgetInfo>& gpus, const StageLayout& l,
                                                            std::uint64_t ram) {
  const auto on_machine = static_cast<std::uint64_t>(std::max(1, std::min(l.local_processes, l.ranks())));
  std::vector<accel::MaxMemory> out;
  for (int s = 0; s < l.stages; ++s) {
    std::optional<accel::MaxMemory> m;
    for (const int rank : l.ranks_of(s)) {
      std::vector<accel::DeviceBudgetInfo> group;
      if (!gpus.empty()) {
        const int local = rank % l.local_processes;
        for (int i = 0; i < l.gpus_per_process; ++i) {
          group.push_back(gpus.at(static_cast<std::size_t>(local * l.gpus_per_process + i)));
          group.back().index = i;
        }
      }
      const auto mine = accel::default_max_memory(group, ram / on_machine);
      if (!m) {
        m = mine;
        continue;
      }
      for (auto& [gpu, bytes] : m->gpus) bytes = std::min(bytes, mine.gpus.at(gpu));
      m->cpu = std::min(*m->cpu, *mine.cpu);
    }
    out.push_back(*m);
  }
  return out;
}

inline std::string stage_units_text(const accel::PipelinePlan& p, const accel::PipelineStage& st) {
  return p.units[st.first_unit] + (st.end_unit - st.first_unit > 1 ? " .. " + p.units[st.end_unit - 1] : std::string());
}

inline std::string ranks_text(const std::vector<int>& ranks) {
  std::string s;
  for (const int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

// "1.183 (its slowest stage 1.18x this plan's)", or why the parameter split does not fit.
inline std::string baseline_text(const accel::PipelinePlan& p) {
  const auto& b = p.by_parameters;
  if (!b.problem.empty()) return "does not fit (" + b.problem + ")";
  const double slowest = *std::max_element(b.seconds.begin(), b.seconds.end());
  const double ours = p.slowest();
  return accel::text::fixed(b.imbalance, 3) + " (its slowest stage " +
         (ours > 0 ? accel::text::fixed(slowest / ours, 3) + "x" : std::string("as slow as")) + " this plan's" +
         (p.parameter_split_kept ? "; it was faster once placed, so this plan is that split)" : ")");
}

inline nlohmann::ordered_json pipeline_json(const accel::PipelinePlan& p, const StageLayout& l, const std::vector<accel::MaxMemory>& budgets,
                                            const std::vector<accel::DeviceMap>& maps, const std::string& rates_note,
                                            std::optional<int> process) {
  nlohmann::ordered_json j;
  j["num_stages"] = l.stages;
  j["num_replicas"] = l.replicas;
  j["ranks"] = l.ranks();
  j["rank_layout"] = "rank = replica * num_stages + stage";
  double total = 0;
  for (const auto& st : p.stages) total += st.seconds;
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    nlohmann::ordered_json e;
    e["stage"] = s;
    e["ranks"] = l.ranks_of(static_cast<int>(s));
    e["first"] = p.units[st.first_unit];
    e["last"] = p.units[st.end_unit - 1];
    e["first_unit"] = st.first_unit;
    e["end_unit"] = st.end_unit;
    e["units"] = st.end_unit - st.first_unit;
    e["bytes"] = st.bytes;
    e["gpu_bytes"] = st.gpu_bytes;
    e["cpu_bytes"] = st.cpu_bytes;
    e["disk_bytes"] = st.disk_bytes;
    e["seconds"] = st.seconds;
    e["share"] = total > 0 ? st.seconds / total : 1.0 / static_cast<double>(p.stages.size());
    e["streamed"] = {{"bytes", st.streamed.streamed()}, {"from_cpu", st.streamed.from_cpu}, {"from_disk", st.streamed.from_disk},
                     {"seconds", st.streamed.seconds}};
    e["tied_copies"] = st.tied_copies;
    e["budgets"] = budgets[s].to_string();
    e["device_map"] = maps[s].to_json();
    stages.push_back(std::move(e));
  }
  j["stages"] = std::move(stages);
  j["imbalance"] = p.imbalance;
  j["slowest_seconds"] = p.slowest();
  const auto& b = p.by_parameters;
  j["parameter_split"] = {{"bounds", b.bounds}, {"seconds", b.seconds}, {"imbalance", b.problem.empty() ? nlohmann::ordered_json(b.imbalance) : nullptr},
                          {"problem", b.problem.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(b.problem)}};
  j["parameter_split_kept"] = p.parameter_split_kept;
  j["rates"] = {{"gpu_read", p.gpu_read}, {"cpu_read", p.cpu_read}, {"host_to_device", p.bandwidths.host_to_device},
                {"disk_read", p.bandwidths.disk_read}, {"source", rates_note}};
  j["units"] = p.units;
  if (process) {
    nlohmann::ordered_json held = nlohmann::ordered_json::array();
    for (int r = *process; r < l.ranks(); r += std::max(1, l.local_processes))
      held.push_back({{"rank", r}, {"replica", r / l.stages}, {"stage", r % l.stages}});
    j["process"] = {{"local_process", *process}, {"holds", std::move(held)}};
  }
  return j;
}

// One row per stage: its estimated time (this plan's, in colour; the parameter split's, a grey
// line), its units and bytes on GPU/CPU/disk.
inline std::string render_pipeline_svg(const accel::PipelinePlan& p, const StageLayout& l, std::string_view title) {
  constexpr double width = 980, left = 150, bar_w = 560, row_h = 58, bar_h = 24;
  const auto title_lines = wrap_text(title, 80);
  const double top = 96 + 22 * static_cast<double>(title_lines.size() - 1);
  double scale = p.slowest();
  for (const double s : p.by_parameters.seconds) scale = std::max(scale, s);
  if (scale <= 0) scale = 1;
  const double height = top + row_h * static_cast<double>(p.stages.size()) + 40;
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) + "\" viewBox=\"0 0 " +
                  num(width) + " " + num(height) + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const double below = text_lines(s, title_lines, 28, 22, "font-size=\"18\" font-weight=\"bold\"");
  s += "<text x=\"20\" y=\"" + num(below) + "\" font-size=\"12\" fill=\"#555\">" +
       xml_escape(accel::detail::concat(accel::text::plural(l.stages, "stage"), " x ", accel::text::plural(l.replicas, "replica"), "; imbalance (slowest / mean) ",
                                        accel::text::fixed(p.imbalance, 3), ", split by parameter count ", baseline_text(p))) +
       "</text>\n";
  s += "<text x=\"20\" y=\"" + num(below + 16) + "\" font-size=\"12\" fill=\"#555\">bar: estimated time per forward pass "
       "(GPU part blue, streamed part orange); grey line: the same stage split by parameter count; full width " +
       xml_escape(accel::text::format_seconds(scale)) + "</text>\n";
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const auto& st = p.stages[k];
    const double y = top + row_h * static_cast<double>(k);
    s += "<text x=\"20\" y=\"" + num(y + 17) + "\" font-size=\"15\" font-weight=\"bold\">stage " + std::to_string(k) + "</text>\n";
    s += "<text x=\"20\" y=\"" + num(y + 33) + "\" font-size=\"11\" fill=\"#555\">ranks " + ranks_text(l.ranks_of(static_cast<int>(k))) +
         "</text>\n";
    const double streamed = std::min(st.streamed.seconds, st.seconds);
    const double w_all = bar_w * st.seconds / scale, w_stream = bar_w * streamed / scale;
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(y) + "\" width=\"" + num(w_all - w_stream) + "\" height=\"" + num(bar_h) +
         "\" fill=\"#4c78a8\"><title>resident reads " + xml_escape(accel::text::format_seconds(st.seconds - streamed)) + "</title></rect>\n";
    if (w_stream > 0)
      s += "<rect x=\"" + num(left + w_all - w_stream) + "\" y=\"" + num(y) + "\" width=\"" + num(w_stream) + "\" height=\"" + num(bar_h) +
           "\" fill=\"#f58518\"><title>streamed " + xml_escape(accel::text::format_seconds(streamed)) + "</title></rect>\n";
    if (k < p.by_parameters.seconds.size()) {
      const double bx = left + bar_w * p.by_parameters.seconds[k] / scale;
      s += "<line x1=\"" + num(bx) + "\" y1=\"" + num(y - 3) + "\" x2=\"" + num(bx) + "\" y2=\"" + num(y + bar_h + 3) +
           "\" stroke=\"#777\" stroke-width=\"2\"/>\n";
    }
    std::string caption = stage_units_text(p, st) + " (" + accel::text::plural(static_cast<long long>(st.end_unit - st.first_unit), "unit") +
                          "): GPU " + accel::text::format_bytes(st.gpu_bytes) + ", CPU " + accel::text::format_bytes(st.cpu_bytes) +
                          ", disk " + accel::text::format_bytes(st.disk_bytes) + (st.tied_copies.empty() ? "" : "; holds a tied copy");
    if (caption.size() > 110) caption = caption.substr(0, 107) + "...";
    s += "<text x=\"" + num(left) + "\" y=\"" + num(y + bar_h + 14) + "\" font-size=\"11\" fill=\"#333\">" + xml_escape(caption) + "</text>\n";
    s += "<text x=\"" + num(left + bar_w + 12) + "\" y=\"" + num(y + 17) + "\" font-size=\"12\">" +
         xml_escape(accel::text::format_seconds(st.seconds)) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

// The text report.
inline void print_pipeline(const accel::PipelinePlan& p, const StageLayout& l, const std::vector<accel::MaxMemory>& budgets,
                           const std::string& rates_note) {
  std::printf("units: %zu in execution order (no-split blocks, modules without children, tensors of split modules); "
              "a stage is a run of whole units\n",
              p.units.size());
  const auto rate = [](double r) { return r >= 1e12 ? accel::text::fixed(r / 1e12, 2) + " TB/s" : accel::text::fixed(r / 1e9, 1) + " GB/s"; };
  std::printf("estimates: weights resident on a GPU read at %s (without a GPU, from host memory at %s), streamed at cpu=%s, "
              "disk=%s (%s); row-read embeddings free\n",
              rate(p.gpu_read).c_str(), rate(p.cpu_read).c_str(), rate(p.bandwidths.host_to_device).c_str(),
              rate(p.bandwidths.disk_read).c_str(), rates_note.c_str());
  const bool same = std::all_of(budgets.begin(), budgets.end(), [&](const auto& b) { return b.to_string() == budgets[0].to_string(); });
  if (same) std::printf("budgets of each stage's process: %s\n", budgets[0].to_string().c_str());
  else
    for (std::size_t s = 0; s < budgets.size(); ++s) std::printf("budgets of stage %zu's process: %s\n", s, budgets[s].to_string().c_str());
  double total = 0;
  for (const auto& st : p.stages) total += st.seconds;
  std::printf("\n%-6s %-44s %6s %11s %11s %11s %11s %6s  %s\n", "stage", "units (first .. last)", "n", "GPU", "CPU", "disk",
              "est. time", "share", "ranks");
  for (std::size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    std::string units = stage_units_text(p, st);
    if (units.size() > 44) units = units.substr(0, 41) + "...";
    std::printf("%-6zu %-44s %6zu %11s %11s %11s %11s %5.1f%%  %s\n", s, units.c_str(), st.end_unit - st.first_unit,
                accel::text::format_bytes(st.gpu_bytes).c_str(), accel::text::format_bytes(st.cpu_bytes).c_str(),
                accel::text::format_bytes(st.disk_bytes).c_str(), accel::text::format_seconds(st.seconds).c_str(),
                total > 0 ? 100.0 * st.seconds / total : 100.0 / static_cast<double>(p.stages.size()),
                ranks_text(l.ranks_of(static_cast<int>(s))).c_str());
  }
  std::printf("\nimbalance (slowest / mean): %s; split by parameter count: %s\n", accel::text::fixed(p.imbalance, 3).c_str(),
              baseline_text(p).c_str());
  for (std::size_t s = 0; s < p.stages.size(); ++s)
    for (const auto& t : p.stages[s].tied_copies)
      std::printf("tied: stage %zu holds %s: its own copy, counted in its bytes\n", s, t.c_str());
}

// `accel plan --stages S`: plans, then prints the report (text, --json) and draws it (--svg).
inline int run_plan_stages(const ParsedArgs& a, const LoadedModel& model, const accel::PlanOptions& opts, accel::DeviceMapMode mode,
                           bool defaulted, const std::vector<accel::MaxMemory>& budgets, const StageLayout& layout,
                           const std::string& header, const std::string& rates_note, accel::MapNames names,
                           std::optional<int> process) {
  accel::PipelineOptions po;
  po.stages = layout.stages;
  po.stage_budgets = budgets;
  po.mode = mode;
  po.budgets_defaulted = defaulted;
  const auto sizes = accel::compute_module_sizes(model.tree, accel::size_options(opts));
  const auto plan = accel::plan_pipeline(model.tree, sizes, opts, po);
  const bool renamed = model.checkpoint && !model.checkpoint->names.identity();
  std::vector<accel::DeviceMap> maps;
  for (const auto& st : plan.stages)
    maps.push_back(names == accel::MapNames::checkpoint && renamed ? accel::to_checkpoint_names(st.plan.device_map, model.checkpoint->names)
                                                                   : st.plan.device_map);
  if (auto svg_path = a.value("svg")) {
    std::ofstream out(*svg_path, std::ios::trunc);
    out << render_pipeline_svg(plan, layout, "accel plan: " + model.label + " in " + accel::text::plural(layout.stages, "stage"));
    if (!out) throw accel::usage_error("plan: cannot write the SVG to '" + *svg_path + "'; check the path");
  }
  if (a.has("json")) {
    std::printf("%s\n", pipeline_json(plan, layout, budgets, maps, rates_note, process).dump(2).c_str());
    if (model.checkpoint)
      for (const auto& w : model.checkpoint->warnings) std::fprintf(stderr, "accel plan: warning: %s\n", w.c_str());
    return 0;
  }
  std::fputs(header.c_str(), stdout);
  if (model.checkpoint)
    for (const auto& w : model.checkpoint->warnings) std::printf("warning: %s\n", w.c_str());
  print_pipeline(plan, layout, budgets, rates_note);
  if (process) {
    std::printf("\nlocal process %d holds:", *process);
    for (int r = *process; r < layout.ranks(); r += std::max(1, layout.local_processes))
      std::printf(" rank %d (stage %d of replica %d)", r, r % layout.stages, r / layout.stages);
    std::printf("\n");
  }
  std::size_t keys = 0;
  for (const auto& m : maps) keys += m.size();
  if (keys <= 40) {
    std::printf("\ndevice maps (HF JSON, %s names; GPU keys index each stage's process's group):\n",
                std::string(accel::map_names_name(names)).c_str());
    for (std::size_t s = 0; s < maps.size(); ++s) std::printf("  stage %zu: %s\n", s, maps[s].to_json_string().c_str());
  } else {
    std::printf("\ndevice maps: %zu entries over %zu stages; print them with --json\n", keys, maps.size());
  }
  return 0;
}

}  // namespace accel_cli
