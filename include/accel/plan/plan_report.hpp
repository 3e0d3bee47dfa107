// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file plan_report.hpp
/// @brief What a device map costs: bytes per device, % of budget, and the bytes that must stream
///        to the execution GPU on every forward pass from CPU and disk, with estimated times.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/plan/device_map.hpp>
#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_options.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Per-forward-pass streaming cost of a plan.
struct PlanReport {
  std::optional<Placement> execution_device{};  ///< PlanResult::execution's GPU (none: runs on CPU)
  std::uint64_t streamed_from_cpu = 0;   ///< bytes copied host → GPU per forward pass
  std::uint64_t streamed_from_disk = 0;  ///< bytes read from disk per forward pass
  double seconds_cpu = 0;                ///< streamed_from_cpu / host_to_device
  double seconds_disk = 0;               ///< disk bytes / disk_read (+ / host_to_device with a GPU)
  Bandwidths bandwidths{};               ///< the rates used
  /// @brief Total estimated transfer time per forward pass (no overlap with compute assumed).
  [[nodiscard]] double seconds_total() const noexcept { return seconds_cpu + seconds_disk; }
};

/// @brief Computes the streaming cost: weights on cpu/disk are copied to the execution device on
///        every forward pass (buffers of offloaded modules stay resident unless offload_buffers).
///        A plan made for PlanObjective::speed counts as its comparison does (a row-read input
///        embedding costs nothing).
[[nodiscard]] inline PlanReport make_plan_report(const PlanResult& plan, const Bandwidths& bw = {}) {
  PlanReport r;
  r.bandwidths = bw;
  if (plan.execution.gpu) r.execution_device = Placement::gpu(*plan.execution.gpu);
  for (const auto& d : plan.devices)  // a PlanResult put together by hand: the first GPU holding modules
    if (!r.execution_device && d.device.is_gpu() && !d.modules.empty()) r.execution_device = d.device;
  for (const auto& d : plan.devices) {
    const std::uint64_t weights = d.placed > d.buffers ? d.placed - d.buffers : 0;
    if (d.device.is_cpu() && r.execution_device) r.streamed_from_cpu += weights;
    if (d.device.is_disk()) r.streamed_from_disk += weights;
  }
  if (plan.objectives) {  // the speed objective counts a row-read input embedding as 0 (StreamingCost)
    r.streamed_from_cpu = plan.objectives->speed.from_cpu;
    r.streamed_from_disk = plan.objectives->speed.from_disk;
  }
  r.seconds_cpu = static_cast<double>(r.streamed_from_cpu) / bw.host_to_device;
  r.seconds_disk = static_cast<double>(r.streamed_from_disk) / bw.disk_read +
                   (r.execution_device ? static_cast<double>(r.streamed_from_disk) / bw.host_to_device : 0.0);
  return r;
}

/// @brief Keys for people: runs of three or more numbered siblings collapse (model.layers.0,
///        model.layers.1, ... → model.layers.0-38); at most `max_items` items, then "... (N more)".
inline std::string summarize_keys(const std::vector<std::string>& keys, std::size_t max_items = 8) {
  std::vector<std::string> items;
  std::size_t i = 0;
  auto split_num = [](const std::string& k, std::string& prefix, long& num) {
    auto dot = k.rfind('.');
    std::string_view tail = dot == std::string::npos ? std::string_view(k) : std::string_view(k).substr(dot + 1);
    if (tail.empty() || tail.size() > 9) return false;
    for (char c : tail)
      if (c < '0' || c > '9') return false;
    prefix = dot == std::string::npos ? std::string() : k.substr(0, dot + 1);
    num = std::stol(std::string(tail));
    return true;
  };
  while (i < keys.size()) {
    std::string prefix, p2;
    long a = 0, b = 0;
    if (split_num(keys[i], prefix, a)) {
      std::size_t j = i + 1;
      long last = a;
      while (j < keys.size() && split_num(keys[j], p2, b) && p2 == prefix && b == last + 1) {
        last = b;
        ++j;
      }
      if (j - i >= 3) {
        items.push_back(detail::concat(prefix, a, "-", last));
        i = j;
        continue;
      }
    }
    items.push_back(keys[i].empty() ? std::string("(everything)") : keys[i]);
    ++i;
  }
  std::string out;
  for (std::size_t k = 0; k < items.size() && k < max_items; ++k) out += (k ? ", " : "") + items[k];
  if (items.size() > max_items) out += detail::concat(", ... (", items.size() - max_items, " more)");
  return out;
}

/// @brief A readable table: one row per device (budget, placed, % of budget, reserve, modules),
///        then the streaming cost and any warnings.
[[nodiscard]] inline std::string format_plan_table(const PlanResult& plan, const PlanReport& report) {
  std::string out;
  auto pad = [](std::string s, std::size_t w) {
    if (s.size() < w) s.resize(w, ' ');
    return s;
  };
  out += pad("device", 8) + pad("budget", 13) + pad("placed", 13) + pad("use", 6) + pad("reserve", 12) + "modules\n";
  for (const auto& d : plan.devices) {
    if (d.modules.empty() && d.device.is_disk() && !d.budget) continue;  // unused unbounded disk
    std::string use = "-";
    if (d.budget && *d.budget > 0)
      use = text::fixed(100.0 * static_cast<double>(d.placed) / static_cast<double>(*d.budget), 0) + "%";
    out += pad(d.device.to_string(), 8) + pad(d.budget ? text::format_bytes(*d.budget) : "unbounded", 13) +
           pad(text::format_bytes(d.placed), 13) + pad(use, 6) + pad(d.main ? text::format_bytes(d.reserve) : "-", 12) +
           (d.modules.empty() ? std::string("(nothing)") : summarize_keys(d.modules)) + "\n";
  }
  out += detail::concat("\nmodel: ", text::format_bytes(plan.total_bytes), " (", plan.total_bytes, " bytes); largest layer ",
                        text::format_bytes(plan.largest_layer), "\n");
  if (const auto& e = plan.execution; e.gpu && e.fetch_buffer_bytes > 0)
    out += e.loadable() ? detail::concat("execution GPU ", *e.gpu, ": room kept for ", e.fetch_slots, " fetch buffer",
                                         e.fetch_slots == 1 ? "" : "s", " of ", text::format_bytes(e.fetch_buffer_bytes), " ('",
                                         e.largest_offloaded_layer, "', the largest layer left on cpu or disk)\n")
                        : detail::concat("execution GPU ", *e.gpu, ": no room for a fetch buffer of ",
                                         text::format_bytes(e.fetch_buffer_bytes), " ('", e.largest_offloaded_layer,
                                         "'); this map cannot be loaded (see the warning)\n");
  if (report.streamed_from_cpu + report.streamed_from_disk == 0) {
    out += "every weight stays on its execution device: nothing streams per forward pass\n";
  } else {
    const std::string target = report.execution_device ? "GPU " + report.execution_device->to_string() : "CPU";
    out += "per forward pass " + text::format_bytes(report.streamed_from_cpu + report.streamed_from_disk) + " stream to " + target + ":";
    if (report.streamed_from_cpu)
      out += " " + text::format_bytes(report.streamed_from_cpu) + " from CPU (" + text::format_seconds(report.seconds_cpu) + " at " +
             text::fixed(report.bandwidths.host_to_device / 1e9, 1) + " GB/s)";
    if (report.streamed_from_disk)
      out += std::string(report.streamed_from_cpu ? "," : "") + " " + text::format_bytes(report.streamed_from_disk) +
             " from disk (" + text::format_seconds(report.seconds_disk) + " at " +
             text::fixed(report.bandwidths.disk_read / 1e9, 1) + " GB/s" +
             (report.execution_device ? " + host to GPU" : "") + ")";
    out += "\nestimated transfer time: " + text::format_seconds(report.seconds_total()) +
           " per forward pass before any compute (it runs, but it is not fast)\n";
  }
  for (const auto& w : plan.warnings) out += "warning: " + w + "\n";
  for (const auto& i : plan.info) out += "note: " + i + "\n";
  return out;
}

/// @brief The "streamed per forward pass" line: both objectives' bytes and time side by side, and
///        for the speed objective each move relative to the fit map ("model.layers.30-33: cpu ->
///        GPU 1 (room freed by ...)"), grouped by where from, where to and why.
/// @param chosen the objective the printed map was planned for
/// @param rates_note where the rates came from ("defaults", a cache file), appended when given
[[nodiscard]] inline std::string format_objective_comparison(const ObjectiveComparison& c, PlanObjective chosen,
                                                             std::string_view rates_note = {}) {
  auto cost = [](const StreamingCost& s) {
    return text::format_bytes(s.streamed()) + " (" + text::format_seconds(s.seconds) + ")";
  };
  std::string out = "streamed per forward pass: fit " + cost(c.fit) + ", speed " + cost(c.speed) + "; this map: " +
                    std::string(plan_objective_name(chosen)) + "; at " + text::fixed(c.bandwidths.host_to_device / 1e9, 1) +
                    " GB/s host-to-GPU, " + text::fixed(c.bandwidths.disk_read / 1e9, 1) + " GB/s disk" +
                    (rates_note.empty() ? std::string() : " (" + std::string(rates_note) + ")");
  if (!c.row_read.empty()) out += "; " + text::quoted_list(c.row_read, 3) + " read by rows, counted 0";
  out += "\n";
  if (chosen != PlanObjective::speed) return out;
  if (!c.speed_map_differs) return out + "speed: the fit map already streams the least it can; kept\n";
  struct Group {
    Placement from, to;
    std::string why;
    std::vector<std::string> modules;
  };
  std::vector<Group> groups;
  for (const auto& m : c.moves) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) { return x.from == m.from && x.to == m.to && x.why == m.why; });
    if (g == groups.end()) g = groups.insert(groups.end(), Group{m.from, m.to, m.why, {}});
    g->modules.push_back(m.module);
  }
  auto where = [](Placement p) { return p.is_gpu() ? "GPU " + p.to_string() : p.to_string(); };
  out += "moved relative to the fit map:\n";
  for (const auto& g : groups)
    out += "  " + summarize_keys(g.modules, 6) + ": " + where(g.from) + " -> " + where(g.to) + " (" + g.why + ")\n";
  return out;
}

ACCEL_NAMESPACE_END
