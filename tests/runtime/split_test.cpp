// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
// Tests for split.hpp: the divmod rule, padding, views, odd inputs (where accelerate crashes).
#include <accel/runtime/split.hpp>

#include <array>
#include <list>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "support/catch.hpp"

using accel::shard_for;
using accel::split_between_processes;

namespace {
template <class V>
std::vector<std::ranges::range_value_t<V>> collect(const V& v) {
  return {v.begin(), v.end()};
}
}  // namespace

TEST_CASE("the first len % n processes get one extra item, in contiguous blocks", "[split]") {
  std::vector<std::size_t> sizes;
  for (std::size_t p = 0; p < 8; ++p) sizes.push_back(shard_for(17, p, 8).size());
  CHECK(sizes == std::vector<std::size_t>{3, 2, 2, 2, 2, 2, 2, 2});
  CHECK(shard_for(17, 1, 8).first_index == 3);
  CHECK(shard_for(17, 7, 8).first_index == 15);
}

TEST_CASE("shards cover the input exactly once, in order, for every length and world size", "[split]") {
  const auto n = GENERATE(1, 2, 3, 4, 7);
  for (std::size_t len = 0; len < 40; ++len) {
    std::size_t next = 0;
    for (std::size_t p = 0; p < static_cast<std::size_t>(n); ++p) {
      const auto s = shard_for(len, p, static_cast<std::size_t>(n));
      CHECK(s.first_index == next);
      next += s.real_count;
    }
    CHECK(next == len);
  }
}

TEST_CASE("a split returns a view of the caller's items, not copies", "[split]") {
  std::vector<int> items{10, 11, 12, 13, 14};
  auto mine = split_between_processes(items, 1, 2);
  REQUIRE(mine.size() == 2);
  CHECK(&*mine.begin() == &items[3]);
  *mine.begin() = 99;
  CHECK(items[3] == 99);
  CHECK(mine[1] == 14);
  static_assert(std::ranges::random_access_range<decltype(mine)>);
  static_assert(std::ranges::view<decltype(mine)>);
}

TEST_CASE("padding gives every process ceil(len/n) items, repeating the input's last item", "[split]") {
  std::vector<int> items(9);
  std::iota(items.begin(), items.end(), 0);
  std::vector<std::vector<int>> got;
  for (std::size_t p = 0; p < 4; ++p) got.push_back(collect(split_between_processes(items, p, 4, {.apply_padding = true})));
  CHECK(got == std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 8}, {5, 6, 8}, {7, 8, 8}});
  const auto s = split_between_processes(items, 2, 4, {.apply_padding = true}).shard();
  CHECK(s.first_index == 5);
  CHECK(s.real_count == 2);
  CHECK(s.padding() == 1);
}

TEST_CASE("fewer items than processes: empty shards without padding, copies of the last item with it", "[split]") {
  std::vector<std::string> items{"a", "b"};
  CHECK(split_between_processes(items, 2, 4).size() == 0);
  CHECK(split_between_processes(items, 2, 4).shard().first_index == 2);
  auto padded = split_between_processes(items, 3, 4, {.apply_padding = true});
  REQUIRE(padded.size() == 1);
  CHECK(padded[0] == "b");
  CHECK(padded.shard().real_count == 0);
}

TEST_CASE("an empty input gives empty shards, with or without padding", "[split]") {
  std::vector<int> none;
  CHECK(split_between_processes(none, 0, 3).size() == 0);
  CHECK(split_between_processes(none, 2, 3, {.apply_padding = true}).size() == 0);
}

TEST_CASE("arrays, spans, strings and rvalue vectors can be split", "[split]") {
  std::array<double, 5> arr{1, 2, 3, 4, 5};
  CHECK(collect(split_between_processes(arr, 0, 2)) == std::vector<double>{1, 2, 3});
  CHECK(collect(split_between_processes(std::span<const double>(arr), 1, 2)) == std::vector<double>{4, 5});
  const std::string text = "abcdefg";
  auto part = split_between_processes(text, 2, 3);
  CHECK(std::string(part.begin(), part.end()) == "fg");
  auto owned = split_between_processes(std::vector<int>{1, 2, 3}, 2, 3);
  CHECK(collect(owned) == std::vector<int>{3});
}

TEST_CASE("a tuple of ranges is split the same way (accelerate's dict of lists)", "[split]") {
  std::vector<int> ids{1, 2, 3, 4};
  std::vector<std::string> text{"a", "b", "c", "d"};
  auto [a, b] = split_between_processes(std::tie(ids, text), 1, 2);
  CHECK(collect(a) == std::vector<int>{3, 4});
  CHECK(collect(b) == std::vector<std::string>{"c", "d"});
  SECTION("unequal lengths are a usage error naming both") {
    std::vector<int> short_ids{1};
    REQUIRE_THROWS_WITH(split_between_processes(std::tie(ids, short_ids), 0, 2),
                        accel_test::contains("range 1 of the tuple has 1 items but range 0 has 4"));
  }
}

TEST_CASE("bad process counts are usage errors", "[split]") {
  std::vector<int> items{1};
  REQUIRE_THROWS_AS(split_between_processes(items, 0, 0), accel::usage_error);
  REQUIRE_THROWS_WITH(split_between_processes(items, 3, 2), accel_test::contains("process index 3 is out of range for 2 processes"));
}

TEST_CASE("copies of a shard view iterate their own shard", "[split]") {
  std::vector<int> items{1, 2, 3, 4, 5, 6};
  auto v = split_between_processes(items, 1, 3, {.apply_padding = true});
  auto copy = v;
  v = split_between_processes(items, 0, 3);
  CHECK(collect(copy) == std::vector<int>{3, 4});
  CHECK(collect(v) == std::vector<int>{1, 2});
}
