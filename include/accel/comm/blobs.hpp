// SPDX-License-Identifier: Apache-2.0
// SPDX-FileCopyrightText: accel contributors
/// @file blobs.hpp
/// @brief Blobs: one byte string per rank, held in a single buffer (what all-gathers return).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"

ACCEL_NAMESPACE_BEGIN

/// @brief Per-rank byte strings in rank order, stored back to back in one buffer (no per-rank allocation).
struct Blobs {
  std::vector<std::byte> buffer;    ///< every part, possibly with framing bytes in between
  std::vector<std::size_t> offset;  ///< where part i starts in `buffer`
  std::vector<std::size_t> length;  ///< how long part i is

  /// @brief Number of parts (the world size for a gather).
  [[nodiscard]] std::size_t size() const noexcept { return offset.size(); }
  /// @brief Part i.
  /// @throws usage_error when i >= size()
  [[nodiscard]] std::span<const std::byte> operator[](std::size_t i) const {
    ACCEL_EXPECTS(i < size(), "Blobs: part ", i, " requested of ", size());
    return std::span<const std::byte>(buffer.data() + offset[i], length[i]);
  }
  /// @brief Appends a part, copying it.
  void push_back(std::span<const std::byte> part) {
    offset.push_back(buffer.size());
    length.push_back(part.size());
    buffer.insert(buffer.end(), part.begin(), part.end());
  }
};

ACCEL_NAMESPACE_END
