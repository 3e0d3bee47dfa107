// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan --svg`: one bar per device with its modules, the budget line and the reserve, all
// bars on one byte scale.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <accel/plan/max_memory.hpp>
#include <accel/plan/plan_report.hpp>
#include <accel/plan/planner.hpp>

namespace accel_cli {

inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// SVG coordinates and lengths, one decimal.
inline std::string num(double v) { return accel::text::fixed(v, 1); }

// `text` in lines of at most `max_chars` characters, broken at spaces; a longer word (a path) is
// cut. SVG text does not wrap by itself: a long line (a model folder's path, the measured-rates
// cache's) would run past the picture's right edge.
inline std::vector<std::string> wrap_text(std::string_view text, std::size_t max_chars) {
  std::vector<std::string> lines;
  std::string line;
  for (std::size_t at = 0; at <= text.size();) {
    const std::size_t end = std::min(text.find(' ', at), text.size());
    std::string_view word = text.substr(at, end - at);
    at = end + 1;
    if (word.empty()) continue;
    if (!line.empty() && line.size() + 1 + word.size() > max_chars) lines.push_back(std::exchange(line, {}));
    for (; word.size() > max_chars; word.remove_prefix(max_chars)) lines.emplace_back(word.substr(0, max_chars));
    line += (line.empty() ? "" : " ") + std::string(word);
  }
  if (!line.empty() || lines.empty()) lines.push_back(std::move(line));
  return lines;
}

// One <text> per line of `lines`, from baseline `y` down by `step`; returns the next baseline.
inline double text_lines(std::string& svg, const std::vector<std::string>& lines, double y, double step, std::string_view attributes) {
  for (const auto& line : lines) {
    svg += "<text x=\"20\" y=\"" + num(y) + "\" " + std::string(attributes) + ">" + xml_escape(line) + "</text>\n";
    y += step;
  }
  return y;
}

/// Sizes of each map key (a module's or tensor's bytes, every shared tensor once).
struct KeySize {
  std::string key;
  std::uint64_t bytes = 0;
};

/// Renders the plan as an SVG document. `keys_per_device[i]` are the keys placed on
/// plan.devices[i] with their sizes, in model order.
inline std::string render_plan_svg(const accel::PlanResult& plan, const accel::PlanReport& report,
                                   const std::vector<std::vector<KeySize>>& keys_per_device, std::string_view title,
                                   std::string_view objectives_line = {}) {
  constexpr double width = 980, left = 150, bar_w = 600, row_h = 64, bar_h = 30, top = 86;
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < plan.devices.size(); ++i)
    if (!(plan.devices[i].device.is_disk() && !plan.devices[i].budget && plan.devices[i].modules.empty())) rows.push_back(i);
  // One byte scale for every bar, so bar lengths compare across devices: the full width is the
  // largest budget or placement of any device drawn.
  std::uint64_t scale = 1;
  for (auto i : rows) scale = std::max({scale, plan.devices[i].budget.value_or(0), plan.devices[i].placed});
  const double scale_bytes = static_cast<double>(scale);
  auto x_of = [&](double bytes) { return left + bar_w * bytes / scale_bytes; };
  // Lines of about 7 px a character at 12-13 px: the picture's width less its margins.
  const auto title_lines = wrap_text(title, 80);
  const double top_y = top + 22 * static_cast<double>(title_lines.size() - 1);
  std::string stream;
  if (report.streamed_from_cpu + report.streamed_from_disk == 0) {
    stream = "nothing streams per forward pass: every weight stays on its execution device";
  } else {
    stream = "per forward pass: " + accel::text::format_bytes(report.streamed_from_cpu) + " from CPU + " +
             accel::text::format_bytes(report.streamed_from_disk) + " from disk to " +
             (report.execution_device ? "GPU " + report.execution_device->to_string() : std::string("CPU")) +
             ", about " + accel::text::format_seconds(report.seconds_total()) + " of transfers at " +
             accel::text::fixed(report.bandwidths.host_to_device / 1e9, 1) + " GB/s host-to-GPU and " +
             accel::text::fixed(report.bandwidths.disk_read / 1e9, 1) + " GB/s disk";
  }
  const auto stream_lines = wrap_text(stream, 120);
  const auto objective_lines = objectives_line.empty() ? std::vector<std::string>{} : wrap_text(objectives_line, 130);
  const double height = top_y + row_h * static_cast<double>(rows.size()) + 30 +
                        20 * static_cast<double>(stream_lines.size() + objective_lines.size());
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
       "\" viewBox=\"0 0 " + num(width) + " " + num(height) + "\" font-family=\"DejaVu Sans, Arial, sans-serif\">\n";
  s += "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
       "<rect width=\"6\" height=\"6\" fill=\"#fdecea\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#e57373\" stroke-width=\"2\"/>"
       "</pattern></defs>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const double below_title = text_lines(s, title_lines, 28, 22, "font-size=\"18\" font-weight=\"bold\"");
  s += "<text x=\"20\" y=\"" + num(below_title) + "\" font-size=\"12\" fill=\"#555\">model " + xml_escape(accel::text::format_bytes(plan.total_bytes)) +
       ", largest layer " + xml_escape(accel::text::format_bytes(plan.largest_layer)) +
       "; every bar on one scale, full width " + xml_escape(accel::text::format_bytes(scale)) + "</text>\n";
  s += "<text x=\"20\" y=\"" + num(below_title + 16) + "\" font-size=\"12\" fill=\"#555\">the grey bar is a device's budget, the red line its limit, "
       "the hatched end the reserve kept for the largest layer</text>\n";
  static constexpr const char* gpu_colors[] = {"#4c78a8", "#72b7b2", "#54a24b", "#88b4d8"};
  static constexpr const char* cpu_colors[] = {"#f58518", "#f2b05e"};
  static constexpr const char* disk_colors[] = {"#9d9d9d", "#c7c7c7"};
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto& d = plan.devices[rows[r]];
    const double y = top_y + row_h * static_cast<double>(r);
    const std::string label = d.device.is_gpu() ? "GPU " + d.device.to_string() : d.device.is_cpu() ? "CPU" : "disk";
    s += "<text x=\"20\" y=\"" + num(y + 19) + "\" font-size=\"15\" font-weight=\"bold\">" + label + "</text>\n";
    s += "<text x=\"20\" y=\"" + num(y + 36) + "\" font-size=\"11\" fill=\"#555\">" +
         (d.budget ? "budget " + accel::text::format_bytes(*d.budget) : std::string("unbounded")) + "</text>\n";
    const double extent = static_cast<double>(d.budget ? std::max(*d.budget, d.placed) : d.placed);
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(y) + "\" width=\"" + num(x_of(extent) - left) + "\" height=\"" + num(bar_h) +
         "\" fill=\"#f4f4f4\" stroke=\"#bbb\"/>\n";
    if (d.main && d.budget && d.reserve > 0) {
      const double rx = x_of(static_cast<double>(*d.budget > d.reserve ? *d.budget - d.reserve : 0));
      s += "<rect x=\"" + num(rx) + "\" y=\"" + num(y) + "\" width=\"" + num(x_of(static_cast<double>(*d.budget)) - rx) +
           "\" height=\"" + num(bar_h) + "\" fill=\"url(#hatch)\"/>\n";
    }
    double cursor = 0;
    const auto& keys = keys_per_device[rows[r]];
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const double x0 = x_of(cursor), x1 = x_of(cursor + static_cast<double>(keys[k].bytes));
      cursor += static_cast<double>(keys[k].bytes);
      const char* color = d.device.is_gpu() ? gpu_colors[(static_cast<std::size_t>(d.device.index) * 2 + k % 2) % 4]
                          : d.device.is_cpu() ? cpu_colors[k % 2] : disk_colors[k % 2];
      s += "<rect x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(x1 - x0, 0.0)) + "\" height=\"" +
           num(bar_h) + "\" fill=\"" + color + "\" stroke=\"white\" stroke-width=\"0.5\"><title>" +
           xml_escape(keys[k].key.empty() ? "(everything)" : keys[k].key) + ": " + accel::text::format_bytes(keys[k].bytes) +
           "</title></rect>\n";
      // Label the segment with the end of its name when it is wide enough (about 6 px a character).
      std::string shortname = keys[k].key.empty() ? std::string("everything") : keys[k].key;
      if (auto dot = shortname.rfind('.'); dot != std::string::npos && dot > 0) {
        auto prev = shortname.rfind('.', dot - 1);
        shortname = shortname.substr(prev == std::string::npos ? 0 : prev + 1);
      }
      if (x1 - x0 > 6.2 * static_cast<double>(shortname.size()) + 8)
        s += "<text x=\"" + num((x0 + x1) / 2) + "\" y=\"" + num(y + bar_h / 2 + 4) +
             "\" font-size=\"10\" fill=\"white\" text-anchor=\"middle\">" + xml_escape(shortname) + "</text>\n";
    }
    // One caption under the bar: the modules, with numbered runs collapsed.
    std::vector<std::string> names;
    for (const auto& k : keys) names.push_back(k.key);
    std::string caption = names.empty() ? std::string("(nothing placed)") : accel::summarize_keys(names, 5);
    if (caption.size() > 95) caption = caption.substr(0, 92) + "...";
    s += "<text x=\"" + num(left) + "\" y=\"" + num(y + bar_h + 15) + "\" font-size=\"11\" fill=\"#333\">" +
         xml_escape(caption) + "</text>\n";
    if (d.budget) {
      const double bx = x_of(static_cast<double>(*d.budget));
      s += "<line x1=\"" + num(bx) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(bx) + "\" y2=\"" + num(y + bar_h + 4) +
           "\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"4,2\"/>\n";
    }
    std::string right = accel::text::format_bytes(d.placed);
    if (d.budget && *d.budget > 0)
      right += " / " + accel::text::format_bytes(*d.budget) + " (" +
               num(100.0 * static_cast<double>(d.placed) / static_cast<double>(*d.budget)) + "%)";
    s += "<text x=\"" + num(left + bar_w + 12) + "\" y=\"" + num(y + 20) + "\" font-size=\"12\">" + xml_escape(right) + "</text>\n";
  }
  const double fy = text_lines(s, stream_lines, top_y + row_h * static_cast<double>(rows.size()) + 20, 18, "font-size=\"13\"");
  text_lines(s, objective_lines, fy + 2, 18, "font-size=\"12\" fill=\"#333\"");  // both objectives, side by side
  s += "</svg>\n";
  return s;
}

}  // namespace accel_cli
