// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Which rank accel launch blames, over synthetic orders of events: the supervisor's reaping order
// and the store's order of departures disagree when a consequence ends before its cause.
#include <accel/launch/detail/blame.hpp>

#include <chrono>
#include <vector>

#include "support/catch.hpp"

using accel::RankDeparture;
using accel::RankGone;
using accel::launch::detail::blame_first_failure;
using accel::launch::detail::departure_of;
using accel::launch::detail::RankEnd;
using accel::launch::detail::SteadyTime;

namespace {
SteadyTime at(int ms) { return SteadyTime{} + std::chrono::milliseconds(1000 + ms); }
RankEnd failed(int rank, int reaped_ms, std::optional<int> left_ms = std::nullopt, bool own = true) {
  return {rank, true, own, at(reaped_ms), left_ms ? std::optional<SteadyTime>(at(*left_ms)) : std::nullopt};
}
}  // namespace

TEST_CASE("a consequence reaped before its cause is not blamed: the store saw the cause leave first", "[launch][blame]") {
  // Rank 1 left the store at 10 ms and was reaped at 300 ms; rank 0 heard of it, left at 12 ms and
  // was reaped at 13 ms.
  const std::vector<RankEnd> ends = {failed(0, 13, 12), failed(1, 300, 10)};
  const auto b = blame_first_failure(ends);
  REQUIRE(b.culprit == 1u);
  REQUIRE(b.consequences == std::vector<std::size_t>{0});
}

TEST_CASE("without the store's view the first failure reaped is blamed", "[launch][blame]") {
  const std::vector<RankEnd> ends = {failed(2, 5), failed(0, 6), failed(1, 7)};
  const auto b = blame_first_failure(ends);
  REQUIRE(b.culprit == 0u);
  REQUIRE(b.consequences == std::vector<std::size_t>{1, 2});
}

TEST_CASE("a rank that never used the store and ended first is blamed before ranks that left the store later", "[launch][blame]") {
  const std::vector<RankEnd> ends = {failed(3, 5), failed(0, 9, 8)};
  REQUIRE(blame_first_failure(ends).culprit == 0u);
  // ... and one that left the store before that rank ended is blamed instead.
  const std::vector<RankEnd> later = {failed(3, 5), failed(0, 9, 4)};
  REQUIRE(blame_first_failure(later).culprit == 1u);
}

TEST_CASE("ranks the launcher stopped and ranks that succeeded are never blamed nor consequences", "[launch][blame]") {
  std::vector<RankEnd> ends = {failed(0, 20, 15), failed(1, 30, 1, /*own=*/false), {2, false, true, at(2), at(1)}};
  auto b = blame_first_failure(ends);
  REQUIRE(b.culprit == 0u);
  REQUIRE(b.consequences.empty());
  ends = {failed(1, 30, 1, false), {2, false, true, at(2), at(1)}};
  REQUIRE(!blame_first_failure(ends).culprit);
}

TEST_CASE("a tie goes to the rank reaped first", "[launch][blame]") {
  const std::vector<RankEnd> ends = {failed(1, 10, 5), failed(0, 11, 5)};
  REQUIRE(blame_first_failure(ends).culprit == 0u);
}

TEST_CASE("a rank's departure is the first time the store saw it leave", "[launch][blame]") {
  const std::vector<RankDeparture> seen = {{1, RankGone::said_goodbye, at(7)}, {0, RankGone::disconnected, at(3)},
                                           {1, RankGone::disconnected, at(4)}};
  REQUIRE(departure_of(seen, 1)->when == at(4));
  REQUIRE(departure_of(seen, 1)->how == RankGone::disconnected);
  REQUIRE(departure_of(seen, 0)->when == at(3));
  REQUIRE(!departure_of(seen, 2));
}
