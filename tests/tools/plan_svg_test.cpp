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
