// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file name_index.hpp
/// @brief Tensor-name lookup without a string per name: a 64-bit name hash, an open-addressing
///        table of ids whose owner keeps the names, and an order-independent fingerprint of
///        (tensor, shard) pairs that compares an index with its shards' headers in one pass; a
///        small cache of views recently looked up.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include <accel/runtime/config.hpp>
#include <accel/runtime/text.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

using text::mix64;

// A hash of a tensor name, eight bytes at a time (names are tens of bytes; std::hash goes a byte
// at a time through a library call).
inline std::uint64_t name_hash(std::string_view s) noexcept {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ s.size();
  const char* p = s.data();
  std::size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  std::uint64_t w = 0;
  if (n) std::memcpy(&w, p, n);
  return mix64(h ^ w);
}

// An order-independent fingerprint of a multiset of (tensor, shard) pairs: equal for an index and
// the headers of its shards exactly when they list the same pairs (short of a 128-bit collision).
// A mismatch sends the caller to the exact comparison, which names what differs.
struct PairPrint {
  std::uint64_t sum = 0, folded = 0;
  std::size_t count = 0;

  void add(std::uint64_t tensor_hash, std::uint64_t shard_hash) noexcept {
    const std::uint64_t pair = tensor_hash ^ mix64(shard_hash + 0x632be59bd9b4e019ull);
    sum += mix64(pair);
    folded ^= mix64(pair ^ 0xd6e8feb86659fd93ull);
    ++count;
  }
  friend bool operator==(const PairPrint&, const PairPrint&) = default;
};

// A set of ids keyed by the names they stand for; the owner keeps the names and passes
// `name_of(id)` to each call. It holds ids, not pointers, so it stays valid when its owner is
// copied or moved. Linear probing over a power-of-two table at most half full; each slot holds
// the hash's upper 32 bits (checked before any name is compared) and id + 1 (0: empty).
class NameIndex {
 public:
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  void reserve(std::size_t n) {
    std::size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    if (capacity > slots_.size()) rehash(capacity);
  }

  // Adds `id` under `hash` unless an entry of an equal name is there: returns that entry's id.
  template <class NameOf>
  std::optional<std::uint32_t> insert(std::uint64_t hash, std::uint32_t id, NameOf&& name_of) {
    if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
    const auto tag = static_cast<std::uint32_t>(hash >> 32);
    const std::string_view name = name_of(id);
    for (std::size_t i = home(tag);; i = (i + 1) & (slots_.size() - 1)) {
      const std::uint64_t s = slots_[i];
      if (s == 0) {
        slots_[i] = (std::uint64_t{tag} << 32) | (std::uint64_t{id} + 1);
        ++size_;
        return std::nullopt;
      }
      const auto other = static_cast<std::uint32_t>(s) - 1;
      if (static_cast<std::uint32_t>(s >> 32) == tag && name_of(other) == name) return other;
    }
  }

  // The id of the entry called `name` (whose hash is `hash`), or nullopt.
  template <class NameOf>
  [[nodiscard]] std::optional<std::uint32_t> find(std::string_view name, std::uint64_t hash, NameOf&& name_of) const {
    if (slots_.empty()) return std::nullopt;
    const auto tag = static_cast<std::uint32_t>(hash >> 32);
    for (std::size_t i = home(tag);; i = (i + 1) & (slots_.size() - 1)) {
      const std::uint64_t s = slots_[i];
      if (s == 0) return std::nullopt;
      const auto id = static_cast<std::uint32_t>(s) - 1;
      if (static_cast<std::uint32_t>(s >> 32) == tag && name_of(id) == name) return id;
    }
  }

 private:
  [[nodiscard]] std::size_t home(std::uint32_t tag) const noexcept {
    return static_cast<std::size_t>((std::uint64_t{tag} * slots_.size()) >> 32);
  }
  void rehash(std::size_t capacity) {
    std::vector<std::uint64_t> old(capacity, 0);
    old.swap(slots_);
    for (const auto s : old) {
      if (s == 0) continue;
      std::size_t i = home(static_cast<std::uint32_t>(s >> 32));
      while (slots_[i] != 0) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = s;
    }
  }

  std::vector<std::uint64_t> slots_;
  std::size_t size_ = 0;
};

// The last few keys looked up and what they stand for, found by address: views of names kept once
// (a NameArena's, a NameTable's) are equal exactly when they are the same view, so a run of
// tensors that share a few names (experts fused into one tensor) skips hashing and comparing them.
// A miss says nothing: the caller then looks the key up the slow way and put()s the answer.
template <class Value, std::size_t N = 8>
class RecentViews {
 public:
  [[nodiscard]] const Value* find(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < used_; ++i)
      if (slots_[i].key.data() == key.data() && slots_[i].key.size() == key.size()) return &slots_[i].value;
    return nullptr;
  }
  void put(std::string_view key, Value value) {
    slots_[next_] = Slot{key, std::move(value)};
    next_ = (next_ + 1) % N;
    used_ = used_ < N ? used_ + 1 : N;
  }

 private:
  struct Slot {
    std::string_view key;
    Value value{};
  };
  std::array<Slot, N> slots_{};
  std::size_t next_ = 0, used_ = 0;
};

}  // namespace detail
ACCEL_NAMESPACE_END
