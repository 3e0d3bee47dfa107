// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// `accel plan --svg`: the drawing's geometry.
#include "../tools/commands/plan_svg.hpp"

#include <regex>
#include <string>
#include <vector>

#include "support/catch.hpp"

namespace {
// Width of the first <rect> whose <title> starts with `key` (a placed key's segment).
double segment_width(const std::string& svg, const std::string& key) {
  const std::regex re("<rect x=\"[0-9.]+\" y=\"[0-9.]+\" width=\"([0-9.]+)\"[^>]*><title>" + key + ":");
  std::smatch m;
  REQUIRE(std::regex_search(svg, m, re));
  return std::stod(m[1].str());
}
}  // namespace

TEST_CASE("accel plan --svg draws every device bar on one byte scale", "[cli][plan][svg]") {
  accel::PlanResult plan;
  plan.total_bytes = 3000;
  plan.devices = {{accel::Placement::gpu(0), 1000, 500, 0, 0, true, {"a"}, {}},
                  {accel::Placement::cpu(), 4000, 2000, 0, 0, true, {"b"}, {}},
                  {accel::Placement::disk(), std::nullopt, 500, 0, 0, false, {"c"}, {}}};
  const auto svg = accel_cli::render_plan_svg(plan, accel::make_plan_report(plan), {{{"a", 500}}, {{"b", 2000}}, {{"c", 500}}},
                                              "scale");
  INFO(svg);
  // The full width (600 px) is the largest budget, the CPU's 4000 bytes: 500 bytes are 75 px on
  // the GPU and on disk alike, 2000 bytes 300 px (each bar used to have a scale of its own, so
  // the GPU's half-full bar was as long as the CPU's).
  CHECK(segment_width(svg, "a") == Approx(75.0));
  CHECK(segment_width(svg, "b") == Approx(300.0));
  CHECK(segment_width(svg, "c") == Approx(75.0));
  CHECK_THAT(svg, accel_test::contains("every bar on one scale, full width 3.91 KiB"));
}

// Defect: the last line printed the measured-rates cache's full path on one line, past the
// picture's right edge (SVG text does not wrap). Every line now fits the width at ~7 px a character.
TEST_CASE("accel plan --svg wraps long lines inside the picture", "[cli][plan][svg]") {
  accel::PlanResult plan;
  plan.total_bytes = 3000;
  plan.devices = {{accel::Placement::gpu(0), 1000, 500, 0, 0, true, {"a"}, {}},
                  {accel::Placement::cpu(), 4000, 2500, 0, 0, true, {"b"}, {}}};
  const std::string path = "/home/someone/" + std::string(150, 'x') + "/bandwidth.json";
  const auto svg = accel_cli::render_plan_svg(plan, accel::make_plan_report(plan), {{{"a", 500}}, {{"b", 2500}}},
                                              "accel plan: /models/" + std::string(120, 'm') + " (auto)",
                                              "fit: 2.44 KiB per pass, 1.2 ms; speed: 0 B per pass (rates measured, from " + path + ")");
  INFO(svg);
  const std::regex text_re("<text x=\"20\" y=\"([0-9.]+)\"[^>]*>([^<]*)</text>");
  double last_y = 0;
  std::string all;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), text_re); it != std::sregex_iterator(); ++it) {
    INFO((*it)[2].str());
    CHECK(20 + 7.0 * static_cast<double>((*it)[2].length()) <= 980);
    last_y = std::max(last_y, std::stod((*it)[1].str()));
    all += (*it)[2].str();
  }
  const std::regex height_re("height=\"([0-9.]+)\" viewBox");
  std::smatch h;
  REQUIRE(std::regex_search(svg, h, height_re));
  CHECK(last_y < std::stod(h[1].str()));
  CHECK_THAT(all, accel_test::contains(std::string(100, 'x')));  // the path is kept, cut into lines
  CHECK_THAT(all, accel_test::contains("/bandwidth.json)"));
  CHECK(accel_cli::wrap_text("a bb ccc", 4) == std::vector<std::string>{"a bb", "ccc"});
  CHECK(accel_cli::wrap_text("abcdefghij", 4) == std::vector<std::string>{"abcd", "efgh", "ij"});
  CHECK(accel_cli::wrap_text("", 4) == std::vector<std::string>{""});
}
