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
#include <tuple>
#include <utility>
#include <vector>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN

namespace detail {

// Above this many units the most even of the optimal splits is searched with monotone stage starts
// (n log n per stage) instead of every start (n^2 per stage); the min-max is exact at any size.
inline constexpr std::size_t split_stages_exact_limit = 1500;

// Stage k's row of the reach: next[j] = 1 when stages 0..k cover units [0, j) with every cost at
// most `limit`, given stage k - 1's row `reach`. With costs that do not decrease as a range grows,
// a stage ending at j is cheapest when it starts as late as the previous stages can end: one sweep.
template <class Cost>
void reach_row(std::size_t k, const std::vector<char>& reach, std::vector<char>& next, const Cost& cost, double limit) {
  std::fill(next.begin(), next.end(), 0);
  std::size_t last = 0;  // the latest end of stage k - 1 before j (0: none)
  for (std::size_t j = 2; j < next.size(); ++j) {
    if (reach[j - 1]) last = j - 1;
    if (last && cost(k, last, j) <= limit) next[j] = 1;
  }
}

inline std::vector<char> first_reach_row(std::size_t n, const auto& cost, double limit) {
  std::vector<char> reach(n + 1, 0);
  for (std::size_t j = 1; j <= n; ++j) reach[j] = cost(0, 0, j) <= limit;
  return reach;
}

// Whether units [0, n) split into `stages` non-empty ranges with every stage cost at most `limit`.
template <class Cost>
bool stages_within(std::size_t n, std::size_t stages, const Cost& cost, double limit) {
  std::vector<char> reach = first_reach_row(n, cost, limit), next(n + 1, 0);
  for (std::size_t k = 1; k < stages; ++k) {
    reach_row(k, reach, next, cost, limit);
    reach.swap(next);
  }
  return reach[n] != 0;
}

// One stage's row of the most-even search: row[j] = least over starts i of prev[i] + cost(k, i, j)^2
// with cost(k, i, j) <= limit, from[j] the earliest such i, for every j in `ends` (ascending).
// Every start (exact), or (`monotone`) divide and conquer over the ends: when squared costs meet
// the quadrangle inequality (additive costs do) the earliest best start never moves left as the
// end moves right, so each end scans only the starts between its neighbours' (exact then; a window
// that finds no start within the limit, where the inequality fails, is widened to every start).
template <class Cost>
void even_row(std::size_t k, const std::vector<double>& prev, std::vector<double>& row, std::vector<std::size_t>& from,
              const std::vector<std::size_t>& ends, const Cost& cost, double limit, bool monotone) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const auto best_start = [&](std::size_t j, std::size_t lo, std::size_t hi) {  // starts [lo, hi] ∩ [k, j)
    double best = inf;
    std::size_t at = 0;
    for (std::size_t i = std::max(lo, k); i <= hi && i < j; ++i) {
      if (prev[i] == inf) continue;
      const double c = cost(k, i, j);
      if (c > limit) continue;
      if (const double v = prev[i] + c * c; v < best) best = v, at = i;
    }
    return std::pair{best, at};
  };
  if (!monotone) {
    for (const auto j : ends) std::tie(row[j], from[j]) = best_start(j, k, j - 1);
    return;
  }
  const auto solve = [&](auto&& self, std::size_t lo, std::size_t hi, std::size_t first, std::size_t last) -> void {
    if (lo >= hi) return;
    const std::size_t mid = lo + (hi - lo) / 2, j = ends[mid];
    auto [best, at] = best_start(j, first, last);
    if (best == inf) std::tie(best, at) = best_start(j, k, j - 1);
    row[j] = best;
    from[j] = at;
    self(self, lo, mid, std::min(first, at), at);
    self(self, mid + 1, hi, at, std::max(last, at));
  };
  solve(solve, 0, ends.size(), k, prev.size() - 1);
}

// Splits units [0, n) into `stages` non-empty contiguous ranges. `cost(k, i, j)` is stage k's cost
// over units [i, j); it must not decrease when the range grows (at either end), may be infinite
// (the range does not fit stage k), and may differ per stage (each stage has its own process).
// Minimises the largest stage cost exactly (a bisection over the doubles' ordered bit patterns,
// each step one sweep per stage); then takes among the splits within it (relative 1e-9) the one
// with the smallest sum of squared stage costs, the earliest stage starts among equals (the last
// stage's first), so equal inputs give equal splits. Up to `exact_limit` units every start is
// tried; above, the starts are searched as monotone (exact for additive costs; for others the
// most even found, never past the least slowest stage).
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
  if (!stages_within(n, stages, cost, value(hi))) return {};
  if (stages_within(n, stages, cost, 0.0)) {
    hi = 0;
  } else {
    std::uint64_t lo = 0;  // infeasible
    while (hi - lo > 1) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      (stages_within(n, stages, cost, value(mid)) ? hi : lo) = mid;
    }
  }
  // Among the splits whose every stage stays within the slowest, the most even one: the least sum
  // of squared costs (a split that keeps the slowest but piles the rest onto one stage is worse
  // for the estimate's errors and for the stages' memory). Row by row: stage k's reachable ends
  // (those the first k + 1 stages cover within the limit) and, for each, its best start.
  const double limit = value(hi) * (1 + 1e-9);
  const bool monotone = n > exact_limit;
  std::vector<std::vector<std::size_t>> from(stages, std::vector<std::size_t>(n + 1, 0));
  std::vector<char> reach = first_reach_row(n, cost, limit), next(n + 1, 0);
  std::vector<double> even(n + 1, inf), row(n + 1, inf);
  for (std::size_t j = 1; j <= n; ++j)
    if (reach[j]) even[j] = cost(0, 0, j) * cost(0, 0, j);
  std::vector<std::size_t> ends;
  for (std::size_t k = 1; k < stages; ++k) {
    reach_row(k, reach, next, cost, limit);
    reach.swap(next);
    ends.clear();
    for (std::size_t j = k + 1; j <= n - (stages - 1 - k); ++j)
      if (reach[j]) ends.push_back(j);
    std::fill(row.begin(), row.end(), inf);
    even_row(k, even, row, from[k], ends, cost, limit, monotone);
    even.swap(row);
  }
  std::vector<std::size_t> bounds(stages + 1, 0);
  bounds[stages] = n;
  for (std::size_t k = stages - 1; k > 0; --k) bounds[k] = from[k][bounds[k + 1]];
  return bounds;
}

}  // namespace detail

ACCEL_NAMESPACE_END
