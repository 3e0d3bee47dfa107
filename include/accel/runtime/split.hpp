// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file split.hpp
/// @brief split_between_processes: each process's contiguous share of an input range, as a view.
///
/// In:  a random-access range of L items, process p of n.
/// Out: a view of items [start, end) where the first L % n processes get one extra item; with
///      padding every process gets ceil(L / n) items, the missing ones repeating the input's last item.
#pragma once

#include <cstddef>
#include <iterator>
#include <ranges>
#include <tuple>
#include <type_traits>
#include <utility>

#include <accel/runtime/config.hpp>
#include <accel/runtime/error.hpp>

ACCEL_NAMESPACE_BEGIN

/// @brief Which part of the input one process holds; enough to un-pad and reorder gathered results.
struct Shard {
  std::size_t index = 0;        ///< the process this shard belongs to
  std::size_t count = 1;        ///< number of processes
  std::size_t total = 0;        ///< length of the whole input
  std::size_t first_index = 0;  ///< global index of the shard's first item (== total for an empty tail shard)
  std::size_t real_count = 0;   ///< items that come from the input (not padding)
  std::size_t padded_count = 0; ///< items in the shard, padding included (== real_count without padding)

  /// @brief Items in the shard, padding included.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return padded_count; }
  /// @brief Items that are copies of the last input item, added for equal lengths.
  [[nodiscard]] constexpr std::size_t padding() const noexcept { return padded_count - real_count; }
  friend constexpr bool operator==(const Shard&, const Shard&) noexcept = default;
};

/// @brief Options for split_between_processes.
struct SplitOptions {
  bool apply_padding = false;  ///< give every process ceil(L/n) items, repeating the last input item
};

/// @brief The shard of process `index` among `count` for an input of `length` items (pure).
/// @throws usage_error when count is 0 or index >= count
constexpr Shard shard_for(std::size_t length, std::size_t index, std::size_t count, SplitOptions options = {}) {
  ACCEL_EXPECTS(count > 0, "split_between_processes: the number of processes must be positive (count=", count, ")");
  ACCEL_EXPECTS(index < count, "split_between_processes: process index ", index, " is out of range for ", count,
                " processes");
  const std::size_t q = length / count, r = length % count;
  Shard s;
  s.index = index;
  s.count = count;
  s.total = length;
  s.first_index = index * q + (index < r ? index : r);
  s.real_count = q + (index < r ? 1 : 0);
  s.padded_count = options.apply_padding && length > 0 ? q + (r > 0 ? 1 : 0) : s.real_count;
  return s;
}

/// @brief A process's share of a random-access range: no copies, items are the input's own.
/// Items past `shard().real_count` (padding) refer to the input's last item.
template <std::ranges::view V>
  requires std::ranges::random_access_range<V> && std::ranges::sized_range<V>
class ShardView : public std::ranges::view_interface<ShardView<V>> {
 public:
  class iterator {
   public:
    using iterator_concept = std::random_access_iterator_tag;
    using iterator_category = std::random_access_iterator_tag;
    using value_type = std::ranges::range_value_t<V>;
    using difference_type = std::ptrdiff_t;
    using reference = std::ranges::range_reference_t<V>;

    iterator() = default;
    iterator(std::ranges::iterator_t<V> base, const Shard* shard, difference_type i) : base_(base), shard_(shard), i_(i) {}

    reference operator*() const { return base_[position(i_)]; }
    reference operator[](difference_type n) const { return base_[position(i_ + n)]; }
    iterator& operator++() { return ++i_, *this; }
    iterator operator++(int) { auto t = *this; ++i_; return t; }
    iterator& operator--() { return --i_, *this; }
    iterator operator--(int) { auto t = *this; --i_; return t; }
    iterator& operator+=(difference_type n) { return i_ += n, *this; }
    iterator& operator-=(difference_type n) { return i_ -= n, *this; }
    friend iterator operator+(iterator it, difference_type n) { return it += n; }
    friend iterator operator+(difference_type n, iterator it) { return it += n; }
    friend iterator operator-(iterator it, difference_type n) { return it -= n; }
    friend difference_type operator-(const iterator& a, const iterator& b) { return a.i_ - b.i_; }
    friend bool operator==(const iterator& a, const iterator& b) { return a.i_ == b.i_; }
    friend auto operator<=>(const iterator& a, const iterator& b) { return a.i_ <=> b.i_; }

   private:
    // Padding items repeat the whole input's last item (accelerate >= 1.14 semantics).
    difference_type position(difference_type i) const {
      const auto real = static_cast<difference_type>(shard_->real_count);
      return i < real ? static_cast<difference_type>(shard_->first_index) + i
                      : static_cast<difference_type>(shard_->total) - 1;
    }
    std::ranges::iterator_t<V> base_{};
    const Shard* shard_ = nullptr;
    difference_type i_ = 0;
  };

  ShardView() = default;
  ShardView(V base, Shard shard) : base_(std::move(base)), shard_(shard) {}
  ShardView(const ShardView& o) : base_(o.base_), shard_(o.shard_) {}
  ShardView(ShardView&& o) noexcept(std::is_nothrow_move_constructible_v<V>) : base_(std::move(o.base_)), shard_(o.shard_) {}
  ShardView& operator=(const ShardView& o) { base_ = o.base_, shard_ = o.shard_; return *this; }
  ShardView& operator=(ShardView&& o) noexcept(std::is_nothrow_move_assignable_v<V>) {
    base_ = std::move(o.base_), shard_ = o.shard_;
    return *this;
  }

  /// @brief Where this share sits in the whole input.
  [[nodiscard]] const Shard& shard() const noexcept { return shard_; }
  iterator begin() const { return iterator(std::ranges::begin(base_), &shard_, 0); }
  iterator end() const { return iterator(std::ranges::begin(base_), &shard_, static_cast<std::ptrdiff_t>(shard_.padded_count)); }
  [[nodiscard]] std::size_t size() const noexcept { return shard_.padded_count; }

 private:
  // Iterators point at shard_, so the view's copies rebind to their own (see the copy members).
  mutable V base_{};
  Shard shard_{};
};

/// @brief Process `index` of `count`'s contiguous share of `range`, as a view (no copies).
///
/// @code
///   std::vector<std::string> prompts = load();
///   auto mine = accel::split_between_processes(prompts, rank, world, {.apply_padding = true});
///   for (const auto& p : mine) run(p);
///   // mine.shard().first_index / real_count say where the real items sit in `prompts`.
/// @endcode
/// @param range a random-access sized range (vector, array, span, string, …); held by reference
///        unless it is an rvalue, which the view then owns
/// @throws usage_error when count is 0 or index >= count
template <std::ranges::viewable_range R>
  requires std::ranges::random_access_range<R> && std::ranges::sized_range<R>
auto split_between_processes(R&& range, std::size_t index, std::size_t count, SplitOptions options = {}) {
  const Shard shard = shard_for(std::ranges::size(range), index, count, options);
  using View = std::views::all_t<R>;
  return ShardView<View>(std::views::all(std::forward<R>(range)), shard);
}

/// @brief Splits several equally long ranges the same way (accelerate's dict-of-lists input).
/// @return a tuple of ShardViews, one per range, with identical shards
/// @throws usage_error when the ranges' lengths differ
template <class... R>
auto split_between_processes(std::tuple<R...> ranges, std::size_t index, std::size_t count, SplitOptions options = {}) {
  static_assert(sizeof...(R) > 0, "split_between_processes needs at least one range in the tuple");
  const std::size_t length = std::ranges::size(std::get<0>(ranges));
  std::apply(
      [&](auto&... r) {
        std::size_t i = 0;
        ((std::ranges::size(r) == length
              ? void(++i)
              : detail::throw_error<usage_error>("split_between_processes: range ", i, " of the tuple has ",
                                                 std::ranges::size(r), " items but range 0 has ", length,
                                                 "; every range must have the same length")),
         ...);
      },
      ranges);
  return std::apply(
      [&](auto&&... r) { return std::make_tuple(split_between_processes(std::forward<decltype(r)>(r), index, count, options)...); },
      std::move(ranges));
}

ACCEL_NAMESPACE_END
