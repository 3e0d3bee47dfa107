// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file store_chunks.hpp
/// @brief How the CPU backend cuts payloads that travel through the store into rounds (pure).
///
/// A round through the store carries at most a budget of bytes in all (every rank's piece, and the
/// reply that holds them all), so neither a store frame nor the store's memory grows with the
/// payload: a 4 GiB gather is 4 GiB / piece rounds of a fixed size, not one frame past the wire's
/// 32-bit lengths.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include <accel/runtime/config.hpp>

ACCEL_NAMESPACE_BEGIN
namespace detail {

/// @brief The smallest piece a rank sends per round, however many ranks share the budget.
inline constexpr std::size_t min_store_piece_bytes = std::size_t{64} << 10;

/// @brief Bytes each of `world` ranks puts into one store round when the round carries at most
/// `round_budget` bytes: the budget shared among the ranks, a multiple of 64, at least
/// min_store_piece_bytes.
inline std::size_t store_piece_bytes(int world, std::size_t round_budget) noexcept {
  const std::size_t per = round_budget / static_cast<std::size_t>(std::max(1, world));
  return std::max(min_store_piece_bytes, per / 64 * 64);
}

/// @brief Rounds after the first that carry the rest of every payload of `sizes` in pieces of
/// `piece` bytes (the largest payload decides; 0 when every payload fits one piece).
inline std::uint64_t continuation_rounds(std::span<const std::uint64_t> sizes, std::size_t piece) noexcept {
  std::uint64_t most = 0;
  for (const auto s : sizes) most = std::max(most, s);
  const std::uint64_t pieces = (most + piece - 1) / piece;
  return pieces > 1 ? pieces - 1 : 0;
}

/// @brief Piece `k` (0-based) of a payload of `size` bytes: [first, first + length); empty past its end.
inline std::pair<std::uint64_t, std::uint64_t> piece_range(std::uint64_t size, std::uint64_t k, std::size_t piece) noexcept {
  const std::uint64_t first = std::min<std::uint64_t>(size, k * piece);
  return {first, std::min<std::uint64_t>(size - first, piece)};
}

}  // namespace detail
ACCEL_NAMESPACE_END
