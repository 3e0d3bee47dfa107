// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// The search behind plan_pipeline's split: contiguous splits of a sequence into stages that
// minimise the slowest stage, pure arithmetic over a cost callback, no model types. (A split once
// placed and timed is a StageSplit, in pipeline_plan.hpp; the units and their costs are in
// stage_units.hpp.)
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstddef>
#include <limits>
#include <vector>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

// Above this many units the quadratic search for the most even of the optimal splits is skipped
// (the min-max itself is exact at any size).
inline constexpr std::size_t split_stages_exact_limit = 1500;

// Whether units [0, n) split into `stages` non-empty ranges with every stage cost at most `limit`;
// with `from`, from[k][j] is where stage k starts when it ends at j. With costs that do not
// decrease as a range grows, a stage ending at j is cheapest when it starts as late as the
// previous stages can end: one sweep per stage.
template <class Cost>
bool stages_within(std::size_t n, std::size_t stages, const Cost& cost, double limit,
                   std::vector<std::vector<std::size_t>>* from) {
  std::vector<char> reach(n + 1, 0), next(n + 1, 0);
  for (std::size_t j = 1; j <= n; ++j) reach[j] = cost(0, 0, j) <= limit;
  for (std::size_t k = 1; k < stages; ++k) {
    std::fill(next.begin(), next.end(), 0);
    std::size_t last = 0;  // the latest end of stage k - 1 before j (0: none)
    for (std::size_t j = 2; j <= n; ++j) {
      if (reach[j - 1]) last = j - 1;
      if (last && cost(k, last, j) <= limit) {
        next[j] = 1;
        if (from) (*from)[k][j] = last;
      }
    }
    reach.swap(next);
  }
  return reach[n] != 0;
}

// Splits units [0, n) into `stages` non-empty contiguous ranges. `cost(k, i, j)` is stage k's cost
// over units [i, j); it must not decrease when the range grows (at either end), may be infinite
// (the range does not fit stage k), and may differ per stage (each stage has its own process).
// Minimises the largest stage cost exactly (a bisection over the doubles' ordered bit patterns,
// each step one sweep per stage); then, up to `exact_limit` units, takes among the splits within
// it (relative 1e-9) the one with the smallest sum of squared stage costs. Ties go to the earliest
// boundary, so equal inputs give equal splits.
// Returns the stages + 1 boundaries (0 first, n last); empty when stages < 1, stages > n, or every
// split has an infinite stage.
template <class Cost>
std::vector<std::size_t> split_stages(std::size_t n, std::size_t stages, const Cost& cost,
                                      std::size_t exact_limit = split_stages_exact_limit) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  if (stages < 1 || stages > n) return {};
  // Non-negative doubles order as their bit patterns do: bisect those for the least feasible limit.
  const auto bits = [](double v) { return std::bit_cast<std::uint64_t>(v); };
  const auto value = [](std::uint64_t b) { return std::bit_cast<double>(b); };
  std::uint64_t hi = bits(std::numeric_limits<double>::max());
  if (!stages_within(n, stages, cost, value(hi), nullptr)) return {};
  if (stages_within(n, stages, cost, 0.0, nullptr)) {
    hi = 0;
  } else {
    std::uint64_t lo = 0;  // infeasible
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (stages_within(n, stages, cost, value(mid), nullptr) ? hi : lo) = mid;
    }
  }
  const double slowest = value(hi);
  std::vector<std::vector<std::size_t>> from(stages, std::vector<std::size_t>(n + 1, 0));
  std::vector<std::size_t> bounds(stages + 1, 0);
  bounds[stages] = n;
  if (n > exact_limit) {
    stages_within(n, stages, cost, slowest, &from);
    for (std::size_t k = stages - 1; k > 0; --k) bounds[k] = from[k][bounds[k + 1]];
    return bounds;
  }
  // Among the splits whose every stage stays within the slowest, the most even one: the least sum
  // of squared costs (a split that keeps the slowest but piles the rest onto one stage is worse
  // for the estimate's errors and for the stages' memory).
  const double limit = slowest * (1 + 1e-9);
  std::vector<std::vector<double>> even(stages, std::vector<double>(n + 1, inf));
  for (std::size_t j = 1; j <= n; ++j)
    if (const double c = cost(0, 0, j); c <= limit) even[0][j] = c * c;
  for (std::size_t k = 1; k < stages; ++k)
    for (std::size_t j = k + 1; j <= n - (stages - 1 - k); ++j)
      for (std::size_t i = k; i < j; ++i) {
        if (even[k - 1][i] == inf) continue;
        const double c = cost(k, i, j);
        if (c > limit) continue;
        if (const double v = even[k - 1][i] + c * c; v < even[k][j]) even[k][j] = v, from[k][j] = i;
      }
  for (std::size_t k = stages - 1; k > 0; --k) bounds[k] = from[k][bounds[k + 1]];
  return bounds;
}

}  // namespace detail

ACCEL_NAMESPACE_END
